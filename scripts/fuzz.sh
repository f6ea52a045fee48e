#!/usr/bin/env bash
# Runs every Fuzz target of the module for FUZZTIME each (default 3000x: three
# thousand inputs), so that `make test` exercises the fuzzers briefly on every
# run. Seed corpora also run as ordinary tests in `go test`.
#
# The default is a count, not a duration, on purpose: with a duration, Go 1.26's
# fuzz coordinator can report its own end-of-time deadline as a failure
# ("context deadline exceeded", no crasher written; golang/go#75804, fixed in
# Go 1.27). CI failed on exactly that. A count has no deadline to race; -timeout
# still bounds every target's wall time.
set -euo pipefail
fuzztime="${FUZZTIME:-3000x}"
status=0
while IFS= read -r file; do
  dir=$(dirname "$file")
  for fn in $(grep -oE '^func (Fuzz[A-Za-z0-9_]+)\(' "$file" | sed -E 's/^func (Fuzz[A-Za-z0-9_]+)\(/\1/'); do
    echo "fuzz: ./$dir $fn ($fuzztime)"
    if ! go test -run '^$' -fuzz "^${fn}\$" -fuzztime "$fuzztime" -timeout 5m "./$dir" >"/tmp/fuzz-$fn.log" 2>&1; then
      cat "/tmp/fuzz-$fn.log"
      status=1
    fi
  done
done < <(git ls-files '*_test.go' 2>/dev/null || find . -name '*_test.go')
exit $status
