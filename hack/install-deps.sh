#!/usr/bin/env bash
# Installs what a fresh machine lacks for the test suite: prlimit (util-linux), Valkey 8 (server, cli, sentinel)
# from Debian's bookworm-backports suite. The archive URI is read from the machine's own
# apt sources so no host name is written here. Idempotent: does nothing when present.
set -euo pipefail

have_valkey() {
  command -v valkey-server >/dev/null 2>&1 && command -v valkey-cli >/dev/null 2>&1 &&
    command -v valkey-sentinel >/dev/null 2>&1
}

SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive

# prlimit (util-linux) runs the service under a file descriptor limit in
# internal/ratelimit/service's tests.
if ! command -v prlimit >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq util-linux >/dev/null
fi

# h2spec (HTTP/2 conformance, internal/ratelimit/server's TestH2Spec), built at a pinned version
# into the repository's tools directory.
H2SPEC_VERSION=v2.2.1+incompatible
tools="$(cd "$(dirname "$0")/.." && pwd)/.tools/bin"
if [ ! -x "$tools/h2spec" ]; then
  mkdir -p "$tools"
  GOBIN="$tools" GOFLAGS=-mod=mod go install "github.com/summerwind/h2spec/cmd/h2spec@$H2SPEC_VERSION"
  echo "install-deps: built h2spec $H2SPEC_VERSION into $tools"
fi

# @grpc/grpc-js (a non-Go gRPC client, internal/ratelimit/server's TestGRPCJSClient), pinned, into
# the tools directory, with the machine's Node.
GRPC_JS_VERSION=1.14.7
node_dir="$(dirname "$tools")/node"
if command -v npm >/dev/null 2>&1 && [ ! -f "$node_dir/node_modules/@grpc/grpc-js/package.json" ]; then
  mkdir -p "$node_dir"
  npm install --silent --no-audit --no-fund --prefix "$node_dir" "@grpc/grpc-js@$GRPC_JS_VERSION" >/dev/null
  echo "install-deps: installed @grpc/grpc-js $GRPC_JS_VERSION into $node_dir"
fi

install_valkey() {

if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null; then
  uri=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -1 || true)
  if [ -z "$uri" ]; then
    uri=$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | grep -v security | head -1 || true)
  fi
  if [ -z "$uri" ]; then
    echo "install-deps: cannot find the Debian archive URI in apt sources" >&2
    exit 1
  fi
  printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$uri" |
    $SUDO tee /etc/apt/sources.list.d/bookworm-backports.sources >/dev/null
fi

$SUDO apt-get update -qq
$SUDO apt-get install -y -qq -t bookworm-backports valkey-server valkey-tools valkey-sentinel >/dev/null
# The packages start a system daemon on 6379 on some machines; tests start their own servers.
$SUDO systemctl stop valkey-server valkey-sentinel >/dev/null 2>&1 || true
echo "install-deps: installed $(valkey-server --version | head -1)"
}

if have_valkey; then
  echo "install-deps: valkey present: $(valkey-server --version | head -1)"
else
  install_valkey
fi
