#!/usr/bin/env bash
# Installs the Go tools that `make lint` and `make proto` use, at pinned
# versions, into $(go env GOPATH)/bin when they are missing.
set -euo pipefail
bin="$(go env GOPATH)/bin"
need() { [ -x "$bin/$1" ] || command -v "$1" >/dev/null 2>&1; }
need staticcheck || go install honnef.co/go/tools/cmd/staticcheck@v0.8.2
if [ "${1:-}" = proto ]; then
  need protoc-gen-go || go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
fi
