#!/usr/bin/env bash
# The resilience rows of the README through the shipped binaries at full
# length: a region cut off and the broker cut off for
# QUOTIENT_E2E_FAULT_FOR each (default 10m), redis-server killed under load,
# the coordinator leader killed and a gateway restarted, in parallel, without the race detector.
# Needs root, ip and nft (the tests skip, naming what is missing, without).
# Prints the tests' own lines; on failure, the last 300 lines of the full
# log (out/e2e-faults.log), which hold each process's log tail.
#
#   make e2e-faults                          # 10 minutes of each fault
#   QUOTIENT_E2E_FAULT_FOR=3m make e2e-faults
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p out
export QUOTIENT_E2E_FAULT_FOR="${QUOTIENT_E2E_FAULT_FOR:-10m}"
echo "e2e-faults: each fault lasts $QUOTIENT_E2E_FAULT_FOR"
go test -count=1 -timeout 60m -parallel 4 -v -run 'TestBinaries(RegionCutOff|BrokerDown|RedisKilled|LeaderKilled|GatewayRestarted)$' ./e2e/ > out/e2e-faults.log 2>&1
rc=$?
grep -E '^(=== RUN|--- |\s+[a-z_]+_test.go|ok|FAIL|PASS|panic)' out/e2e-faults.log
if [ $rc -ne 0 ]; then
  echo "e2e-faults: FAILED (exit $rc); the last lines of out/e2e-faults.log:"
  tail -n 300 out/e2e-faults.log
fi
exit $rc
