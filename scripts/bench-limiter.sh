#!/usr/bin/env bash
# The limiter core's figures (README "Measured (limiter core)", issue 16)
# in one run: Check with two policies against redis_rate (decisions/s, the
# ratios, Redis's time and CPU per decision), the latency of Check at half
# its peak, both unpinned and with redis-server pinned to CPU 0 and the
# benchmark to CPU 1 (taskset), and the in-process MemoryStore on one
# core. Prints the machine's load average first: on shared cores the
# absolute numbers move with it, the ratios much less.
set -euo pipefail
cd "$(dirname "$0")/../limiter"
GO=${GO:-go}
BENCHTIME=${LIMITER_BENCHTIME:-3x}
bin=$(mktemp -d)/limiter.test
trap 'rm -rf "$(dirname "$bin")"' EXIT
$GO test -c -o "$bin" .
redis_bench='^(BenchmarkCompareRedisRate|BenchmarkCheckLatencyAtHalfPeak)$'
load() { echo "load average $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"; }

echo "== unpinned: redis-server and the benchmark share every core ($(load))"
"$bin" -test.run '^$' -test.bench "$redis_bench" -test.benchtime "$BENCHTIME"

echo "== MemoryStore on one core ($(load))"
"$bin" -test.run '^$' -test.bench '^BenchmarkMemoryStore$' -test.cpu 1 -test.benchtime 2s -test.benchmem

if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
	echo "== pinned: redis-server on CPU 0, the benchmark on CPU 1 ($(load))"
	QUOTIENT_BENCH_REDIS_CPUS=0 taskset -c 1 "$bin" -test.run '^$' -test.bench "$redis_bench" -test.benchtime "$BENCHTIME"
else
	echo "== pinned: skipped, this machine lacks taskset or a second core"
fi
echo "== done ($(load))"
