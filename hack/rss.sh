#!/bin/bash
# Peak RSS of our service with the embedded store over 1,000,000 principals
# (docs/reliability.md "Memory per principal"). Usage: hack/rss.sh LABEL, with
# GC_PERCENT, GOMEMLIMIT or MEMORY_LIMIT_RATIO in the environment: the service
# inherits it. Builds both binaries into $TMPDIR first.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=${TMPDIR:-/tmp}
go build -o "$tmp/rl" ./cmd/ratelimit
go build -o "$tmp/rlbench" ./cmd/rlbench
label=${1:?usage: hack/rss.sh LABEL}
"$tmp/rlbench" -ours-bin "$tmp/rl" -only ours -key-format memory-store -principals 1000000 -duration 60s -warmup 1s -rounds 1 -max-requests 3000000 > "$tmp/rlbench-$label.log" 2>&1 &
b=$!
peak=0
while kill -0 $b 2>/dev/null; do
  for p in $(pgrep -f "^$tmp/rl( |\$)"); do r=$(awk '/VmRSS/{print $2}' /proc/$p/status 2>/dev/null || true); [ -n "$r" ] && [ "$r" -gt "$peak" ] && peak=$r; done
  sleep 1
done
echo "$label: peak RSS $((peak / 1024)) MiB"
tail -3 "$tmp/rlbench-$label.log"
