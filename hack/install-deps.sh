#!/usr/bin/env bash
# Installs what a fresh machine lacks for the test suite: Valkey 8 (server, cli, sentinel), helm,
# Chromium (the HTML report's screenshot test), PostgreSQL (the durable ledger's tests:
# internal/pgtest runs initdb and postgres), prlimit, curl, h2spec and @grpc/grpc-js (the gRPC
# server's conformance and foreign-client tests), Prometheus and promtool (the alert rules'
# tests in deploy/monitoring). Works on Debian and Ubuntu:
# - Debian bookworm: Valkey from bookworm-backports (the archive URI is read from the
#   machine's own apt sources, so no host name is written here); later Debian: main.
# - Ubuntu: Valkey from the release's own archive when it has it (24.10 and later);
#   no Debian source is ever added on Ubuntu. Ubuntu's chromium deb is a snap
#   wrapper that does not run in containers, so the test needs a real chromium there.
# Idempotent: installs only what is missing; says clearly what it cannot install.
set -euo pipefail

SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive

# shellcheck disable=SC1091
. /etc/os-release 2>/dev/null || true
OS_ID=${ID:-unknown}
CODENAME=${VERSION_CODENAME:-}

have_valkey() {
  command -v valkey-server >/dev/null 2>&1 && command -v valkey-cli >/dev/null 2>&1 &&
    command -v valkey-sentinel >/dev/null 2>&1
}
have_chromium() {
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || command -v google-chrome >/dev/null 2>&1
}
# candidate PKG: the version apt would install, empty when none.
candidate() { apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}' | grep -v '(none)' || true; }

updated=""
apt_update() {
  [ -n "$updated" ] && return
  $SUDO apt-get update -qq
  updated=1
}

# prlimit (util-linux) runs the service under a file descriptor limit in
# internal/ratelimit/service's tests.
if ! command -v prlimit >/dev/null 2>&1; then
  apt_update
  $SUDO apt-get install -y -qq util-linux >/dev/null
fi

# curl (action.yml's release download, run by internal/cli's TestActionDownloadsPinnedRelease
# against a loopback server).
if ! command -v curl >/dev/null 2>&1; then
  apt_update
  $SUDO apt-get install -y -qq curl >/dev/null
fi

# h2spec (HTTP/2 conformance, internal/ratelimit/server's TestH2Spec), built into the repository's
# tools directory from hack/tools/h2spec, whose go.mod and go.sum pin h2spec and its dependencies
# (h2spec has no go.mod of its own: `go install ...@VERSION` would float them).
tools="$(cd "$(dirname "$0")/.." && pwd)/.tools/bin"
if [ ! -x "$tools/h2spec" ]; then
  mkdir -p "$tools"
  (cd "$(dirname "$0")/tools/h2spec" && GOBIN="$tools" GOFLAGS=-mod=readonly go install github.com/summerwind/h2spec/cmd/h2spec)
  echo "install-deps: built h2spec $(grep summerwind/h2spec "$(dirname "$0")/tools/h2spec/go.mod" | awk '{print $NF}') into $tools"
fi

# egctl and egrlsconfig (test/e2e's TestEnvoyGatewayTranslatesLikeRlsconfig: Envoy Gateway's own
# translator against internal/rlsconfig), built into the tools directory from hack/tools/egctl,
# whose go.mod pins github.com/envoyproxy/gateway at the version in budgetgen's go.mod (the test
# fails if they differ) and whose go.sum pins what EG's go.mod resolves to. egctl's dependencies
# (helm, troubleshoot, ...) are not in budgetgen's module, hence a module of its own. The first
# build compiles about 2,500 packages (minutes on 2 cores); later runs find them in the build cache.
# A stamp of the module's files rebuilds both when the pin or egrlsconfig changes.
egctl_mod="$(dirname "$0")/tools/egctl"
egctl_stamp="$tools/.egctl-$(cat "$egctl_mod/go.mod" "$egctl_mod/go.sum" "$egctl_mod/egrlsconfig/main.go" | sha256sum | cut -c1-16)"
if [ ! -x "$tools/egctl" ] || [ ! -x "$tools/egrlsconfig" ] || [ ! -f "$egctl_stamp" ]; then
  mkdir -p "$tools"
  rm -f "$tools"/.egctl-*
  (cd "$egctl_mod" && GOBIN="$tools" GOFLAGS=-mod=readonly go install github.com/envoyproxy/gateway/cmd/egctl ./egrlsconfig)
  touch "$egctl_stamp"
  echo "install-deps: built egctl and egrlsconfig (envoyproxy/gateway $(grep -E '^\s*github.com/envoyproxy/gateway ' "$egctl_mod/go.mod" | awk '{print $NF}')) into $tools"
fi

# helm (deploy/'s chart tests: helm lint and helm template of deploy/helm/budgetgen-ratelimit, and
# Envoy Gateway's own chart rendered with deploy/envoy-gateway/helm-values.yaml), built from its
# module at a pinned version (helm's go.mod pins its dependencies) into the tools directory.
HELM_VERSION=v3.22.0
# (A go-installed helm reports only its minor version, so a stamp file records the exact one.)
if [ ! -x "$tools/helm" ] || [ ! -f "$tools/.helm-$HELM_VERSION" ]; then
  mkdir -p "$tools"
  GOBIN="$tools" GOFLAGS=-mod=mod go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  touch "$tools/.helm-$HELM_VERSION"
  echo "install-deps: built helm $HELM_VERSION into $tools"
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
  if have_valkey; then
    echo "install-deps: valkey present: $(valkey-server --version | head -1)"
    return
  fi
  local suite=()
  case "$OS_ID" in
  debian)
    if [ "$CODENAME" = bookworm ]; then
      if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null; then
        uri=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -1 || true)
        if [ -z "$uri" ]; then
          uri=$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | grep -v security | head -1 || true)
        fi
        if [ -z "$uri" ]; then
          echo "install-deps: cannot find the Debian archive URI in apt sources; install valkey-server, valkey-tools and valkey-sentinel (Valkey 8) yourself" >&2
          exit 1
        fi
        printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$uri" |
          $SUDO tee /etc/apt/sources.list.d/bookworm-backports.sources >/dev/null
        updated=""
      fi
      suite=(-t bookworm-backports)
    fi
    ;;
  ubuntu) ;;
  *)
    echo "install-deps: $OS_ID is neither Debian nor Ubuntu; install Valkey 8 (valkey-server, valkey-cli, valkey-sentinel) yourself" >&2
    exit 1
    ;;
  esac
  apt_update
  if [ -z "$(candidate valkey-server)" ] && [ ${#suite[@]} -eq 0 ]; then
    echo "install-deps: this $OS_ID release ($CODENAME) has no valkey-server package; Ubuntu has it from 24.10." >&2
    echo "install-deps: install Valkey 8 yourself (e.g. build from source, valkey.io) so valkey-server, valkey-cli and valkey-sentinel are on PATH" >&2
    exit 1
  fi
  $SUDO apt-get install -y -qq "${suite[@]}" valkey-server valkey-tools valkey-sentinel >/dev/null
  # The packages start a system daemon on 6379 on some machines; tests start their own servers.
  $SUDO systemctl stop valkey-server valkey-sentinel >/dev/null 2>&1 || true
  echo "install-deps: installed $(valkey-server --version | head -1)"
}

install_chromium() {
  if have_chromium; then
    echo "install-deps: chromium present"
    return
  fi
  if [ "$OS_ID" = ubuntu ]; then
    echo "install-deps: Ubuntu's chromium is a snap; install a Chromium or Chrome deb yourself for the report screenshot test (it fails under CI=true without one)" >&2
    return
  fi
  apt_update
  $SUDO apt-get install -y -qq chromium >/dev/null
  echo "install-deps: installed $(chromium --version 2>/dev/null | head -1)"
}

# Prometheus and promtool (deploy/monitoring: promtool check/test rules, and a real Prometheus
# scraping the service): the distribution's prometheus package, pinned to its major version
# (Debian bookworm has 2.42; the rule file and unit-test formats are stable across 2.x and 3.x).
# --no-install-recommends skips node-exporter; tests start their own Prometheus on loopback.
install_prometheus() {
  if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    echo "install-deps: prometheus present: $(prometheus --version 2>&1 | head -1)"
    return
  fi
  apt_update
  if [ -z "$(candidate prometheus)" ]; then
    echo "install-deps: no prometheus package on this $OS_ID release; install prometheus and promtool (2.x or later) yourself" >&2
    exit 1
  fi
  $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  # Some machines start the packaged daemon on :9090; tests start their own.
  $SUDO systemctl stop prometheus >/dev/null 2>&1 || true
  echo "install-deps: installed $(prometheus --version 2>&1 | head -1)"
}

# PostgreSQL server binaries (initdb, postgres, psql) from the distribution: Debian 12
# ships 15, later releases newer; the tests need 12 or later. Debian keeps them in
# /usr/lib/postgresql/<version>/bin, off PATH; internal/pgtest finds them there (or via
# pg_config --bindir). No cluster is created or started: each test makes its own.
have_postgres() {
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1; }
}
install_postgres() {
  if have_postgres; then
    echo "install-deps: postgresql present: $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | tail -1)"
    return
  fi
  apt_update
  $SUDO apt-get install -y -qq postgresql >/dev/null
  # The package starts a default cluster on 5432 on some machines; tests start their own.
  $SUDO systemctl stop postgresql >/dev/null 2>&1 || true
  echo "install-deps: installed $(ls -d /usr/lib/postgresql/*/bin | tail -1)"
}

install_valkey
install_chromium
install_prometheus
install_postgres
