#!/usr/bin/env bash
# Side-by-side benchmark of envoyproxy/ratelimit and `quotient rls` (issue
# #13): both on the same redis-server with the same configuration and load
# (64 concurrent gRPC callers, two descriptors per request, 10,000 keys),
# one after the other in one run, first pinned (redis-server on CPU 0, the
# server under test and the load on CPU 1, with taskset), then unpinned.
# Prints decisions/s, p50 and p99 of both, the ratios, and the share of
# quotient's policy decisions that its Redis store made within the deadline
# (the rest: the fallback or the deny cache).
#
# envoyproxy/ratelimit is built from its Go module (go mod download
# github.com/envoyproxy/ratelimit@$RATELIMIT_VERSION, copied to a scratch
# directory, go build ./src/service_cmd); nothing of it is committed.
# Environment: RATELIMIT_VERSION (latest), DURATION (10s), WARMUP (2s),
# CALLERS (64), KEYS (10000), QUOTIENT_TIMEOUTS (quotient's --timeout
# values, one run each: "5ms 50ms", the default and one long enough that
# the store, not the fallback, decides on a loaded machine),
# QUOTIENT_VARIANTS (more quotient rows, each with extra flags, at every
# timeout: "label=FLAGS;label=FLAGS", e.g. the old defaults side by side
# with the new: "old=--redis-pipeline 4 --grpc-stream-workers 0"; none by
# default), RATELIMIT_ENV (extra environment of envoyproxy/ratelimit, e.g.
# "GOGC=400"; none by default), BENCH_DIR (scratch and build cache,
# /tmp/quotient-bench-rls).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
dir=${BENCH_DIR:-/tmp/quotient-bench-rls}
version=${RATELIMIT_VERSION:-latest}
duration=${DURATION:-10s}
warmup=${WARMUP:-2s}
callers=${CALLERS:-64}
keys=${KEYS:-10000}
qtimeouts=${QUOTIENT_TIMEOUTS:-5ms 50ms}
read -r -a rl_env <<< "${RATELIMIT_ENV:-}"
variants=("") # "": quotient's defaults
IFS=';' read -r -a extra <<< "${QUOTIENT_VARIANTS:-}"
for v in "${extra[@]}"; do [ -n "$v" ] && variants+=("$v"); done
mkdir -p "$dir"
for tool in redis-server redis-cli taskset go; do
  command -v "$tool" >/dev/null || { echo "bench-rls: $tool is not installed" >&2; exit 1; }
done
[ "$(nproc)" -ge 2 ] || { echo "bench-rls: the pinned run needs 2 CPUs, this machine has $(nproc)" >&2; exit 1; }

echo "bench-rls: building quotient and the load"
go build -o "$dir/quotient" ./cmd/quotient
go build -o "$dir/load" ./scripts/bench-rls

mod=$(go mod download -json "github.com/envoyproxy/ratelimit@$version")
rl_version=$(printf '%s' "$mod" | sed -n 's/^[[:space:]]*"Version": "\(.*\)",$/\1/p')
rl_dir=$(printf '%s' "$mod" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -n "$rl_dir" ] || { echo "bench-rls: go mod download gave no module directory: $mod" >&2; exit 1; }
if [ ! -x "$dir/ratelimit-$rl_version" ]; then
  echo "bench-rls: building envoyproxy/ratelimit $rl_version"
  rm -rf "$dir/src"
  cp -r "$rl_dir" "$dir/src"
  chmod -R u+w "$dir/src"
  (cd "$dir/src" && go build -o "$dir/ratelimit-$rl_version" ./src/service_cmd)
fi

# The configuration both load: envoyproxy's layout, RUNTIME_ROOT/./config.
rm -rf "$dir/runtime"
mkdir -p "$dir/runtime/config"
cat > "$dir/runtime/config/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: user
    rate_limit:
      unit: second
      requests_per_unit: 1000000
  - key: route
    rate_limit:
      unit: minute
      requests_per_unit: 1000000
YAML

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { # port, name, log
  for _ in $(seq 1 200); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "bench-rls: $2 did not listen on $1; its log:" >&2
  tail -n 30 "$3" >&2
  exit 1
}
stop_pid() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# run_one MODE NAME [TIMEOUT [VARIANT]]: starts NAME's server (quotient
# with --timeout TIMEOUT and the VARIANT's flags, "label=FLAGS"), loads
# it, stops it; prints the load's line. MODE pinned puts the server and
# the load on CPU 1.
run_one() {
  local mode=$1 name=$2 qtimeout=${3:-} variant=${4:-} pin=() port log pid label=$2 vflags=()
  [ "$mode" = pinned ] && pin=(taskset -c 1)
  redis-cli -p "$redis_port" flushall >/dev/null
  port=$(free_port)
  [ -n "$qtimeout" ] && label="quotient@$qtimeout"
  if [ -n "$variant" ]; then
    label="$label/${variant%%=*}"
    read -r -a vflags <<< "${variant#*=}"
  fi
  log="$dir/${label//\//-}-$mode.log"
  if [ "$name" = envoyproxy ]; then
    env -i PATH="$PATH" HOME="$HOME" \
      REDIS_URL="127.0.0.1:$redis_port" REDIS_SOCKET_TYPE=tcp \
      RUNTIME_ROOT="$dir/runtime" RUNTIME_SUBDIRECTORY=. RUNTIME_WATCH_ROOT=false \
      USE_STATSD=false LOG_LEVEL=warn \
      GRPC_PORT="$port" PORT="$(free_port)" DEBUG_PORT="$(free_port)" \
      HOST=127.0.0.1 GRPC_HOST=127.0.0.1 DEBUG_HOST=127.0.0.1 "${rl_env[@]}" \
      "${pin[@]}" "$dir/ratelimit-$rl_version" > "$log" 2>&1 &
  else
    metrics_port=$(free_port)
    "${pin[@]}" "$dir/quotient" rls --listen "127.0.0.1:$port" --redis "127.0.0.1:$redis_port" \
      --config-dir "$dir/runtime" --timeout "$qtimeout" --metrics-listen "127.0.0.1:$metrics_port" \
      --event-sample 0 "${vflags[@]}" > "$log" 2>&1 &
  fi
  pid=$!
  pids+=("$pid")
  wait_port "$port" "$name" "$log"
  "${pin[@]}" "$dir/load" --addr "127.0.0.1:$port" --name "$label" --callers "$callers" --keys "$keys" \
    --warmup "$warmup" --duration "$duration" --server-pid "$pid" --redis "127.0.0.1:$redis_port"
  if [ "$name" = quotient ]; then
    curl -s "http://127.0.0.1:$metrics_port/metrics" | awk '
      /^quotient_limiter_decisions_total\{/ { total += $NF; if ($0 ~ /source="store"/) store += $NF }
      END { if (total > 0) printf " store_frac=%.3f", store / total }'
  fi
  stop_pid "$pid"
}

results=()
for mode in pinned unpinned; do
  redis_port=$(free_port)
  redis_pin=()
  [ "$mode" = pinned ] && redis_pin=(taskset -c 0)
  "${redis_pin[@]}" redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
    > "$dir/redis-$mode.log" 2>&1 &
  rpid=$!
  pids+=("$rpid")
  wait_port "$redis_port" redis-server "$dir/redis-$mode.log"
  echo "bench-rls: $mode (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  line=$(run_one "$mode" envoyproxy)
  echo "$line"
  results+=("$mode $line")
  for t in $qtimeouts; do
    for v in "${variants[@]}"; do
      line=$(run_one "$mode" quotient "$t" "$v" | tr -d '\n')
      echo "$line"
      results+=("$mode $line")
    done
  done
  stop_pid "$rpid"
done

echo
echo "bench-rls: envoyproxy/ratelimit $rl_version vs quotient rls (--timeout per row), $callers callers, 2 descriptors, $keys keys, $duration each"
printf '| run | server | decisions/s | p50 ms | p99 ms | decided by the store |\n|---|---|---|---|---|---|\n'
for r in "${results[@]}"; do
  mode=${r%% *}
  printf '%s\n' "$r" | awk -v mode="$mode" '
    /decisions\/s=/ { for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      printf "| %s | %s | %s | %s | %s | %s |\n", mode, $2, v["decisions/s"], v["p50_ms"], v["p99_ms"], ("store_frac" in v) ? v["store_frac"] : "all" }'
done
echo
echo "bench-rls: CPU per decision (µs; server, load, redis-server) and Redis commands per decision (calls, µs)"
for r in "${results[@]}"; do
  mode=${r%% *}
  printf '%s\n' "$r" | awk -v mode="$mode" '
    /decisions\/s=/ { out = ""; for (i = 1; i <= NF; i++) if ($i ~ /_cpu_us=|^redis_[a-z|]+=/) out = out " " $i
      printf "%s %s:%s\n", mode, $2, out }'
done
for mode in pinned unpinned; do
  for t in $qtimeouts; do
  for v in "${variants[@]}"; do
  q_label="quotient@$t"
  [ -n "$v" ] && q_label="$q_label/${v%%=*}"
  e=$(printf '%s\n' "${results[@]}" | grep "^$mode envoyproxy " | head -1)
  q=$(printf '%s\n' "${results[@]}" | grep -F "$mode $q_label " | head -1)
  awk -v mode="$mode $q_label" -v e="$e" -v q="$q" 'function get(s, k,   n, i, a, kv) { n = split(s, a, " "); for (i = 1; i <= n; i++) { split(a[i], kv, "="); if (kv[1] == k) return kv[2] } }
    BEGIN { printf "%s: quotient/envoyproxy decisions/s %.2f x (target >= 3), p99 %.2f x (target <= 0.33), p50 %.2f x\n", mode,
      get(q, "decisions/s") / get(e, "decisions/s"), get(q, "p99_ms") / get(e, "p99_ms"), get(q, "p50_ms") / get(e, "p50_ms") }'
  done
  done
done
