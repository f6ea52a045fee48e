#!/usr/bin/env bash
# Runs every Fuzz target of the module for FUZZTIME each (default 5s), so that
# `make test` exercises the fuzzers briefly on every run. Seed corpora also run
# as ordinary tests in `go test`.
set -euo pipefail
fuzztime="${FUZZTIME:-5s}"
status=0
while IFS= read -r file; do
  dir=$(dirname "$file")
  for fn in $(grep -oE '^func (Fuzz[A-Za-z0-9_]+)\(' "$file" | sed -E 's/^func (Fuzz[A-Za-z0-9_]+)\(/\1/'); do
    echo "fuzz: ./$dir $fn ($fuzztime)"
    if ! go test -run '^$' -fuzz "^${fn}\$" -fuzztime "$fuzztime" "./$dir" >"/tmp/fuzz-$fn.log" 2>&1; then
      cat "/tmp/fuzz-$fn.log"
      status=1
    fi
  done
done < <(git ls-files '*_test.go' 2>/dev/null || find . -name '*_test.go')
exit $status
