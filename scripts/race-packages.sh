#!/usr/bin/env bash
# Prints the import paths make test's race suite runs (every package but
# ./e2e), the slowest first. go test starts packages in the order it is
# given them, up to -p at a time, so with the alphabetical order of
# `go list` the four slowest (rebalancer, region, simulations,
# simulations/live: 56 to 100 s each under -race) started last and ran on
# after everything else had finished. The list below is in the order of the
# race times of a warm CI run (session 17, -p 2); a package missing from it
# only runs later, so a stale list costs time, never a test.
set -euo pipefail
cd "$(dirname "$0")/.."
mod=$(go list -m)
slow=(limiter rebalancer cmd/quotient region simulations/live dailyquota/kafkarepl
  simulations rebalancer/redisio rebalancer/kafkabus region/policysync rls/quota
  deploy/terraform internal/kafkautil internal/redistest region/membership rls)
all=$(go list ./... | grep -v "/e2e$")
for p in "${slow[@]}"; do
  if grep -qx "$mod/$p" <<<"$all"; then echo "$mod/$p"; fi
done
grep -vxF -f <(printf "$mod/%s\n" "${slow[@]}") <<<"$all"
