#!/usr/bin/env bash
# Offline checks of the Terraform modules in deploy/terraform: no terraform
# binary, no provider or plugin download, no cloud credentials.
#
#   scripts/terraform-check.sh          install the tools if missing, then run
#                                       hclfmt, tflint and the Go checks
#   scripts/terraform-check.sh install  only install the tools
#   scripts/terraform-check.sh static   hclfmt and tflint only (make lint:
#                                       the Go checks are tests, and make
#                                       test runs them in its race suite)
#
# The tools go into $(go env GOPATH)/bin at pinned versions (both build with
# Go 1.26). tflint uses only its bundled terraform ruleset (.tflint.hcl in
# deploy/terraform); the AWS ruleset is a download and is not used.
set -euo pipefail

HCLFMT_VERSION=v2.25.0  # github.com/hashicorp/hcl/v2/cmd/hclfmt
TFLINT_VERSION=v0.64.0  # github.com/terraform-linters/tflint (bundled terraform ruleset 0.15.0)

cd "$(dirname "$0")/.."
bin="$(go env GOPATH)/bin"
export PATH="$bin:$PATH"

have() { [ -x "$bin/$1" ] || command -v "$1" >/dev/null 2>&1; }
if ! have hclfmt; then
  echo "terraform-check: installing hclfmt $HCLFMT_VERSION" >&2
  go install "github.com/hashicorp/hcl/v2/cmd/hclfmt@$HCLFMT_VERSION"
fi
if ! have tflint; then
  echo "terraform-check: installing tflint $TFLINT_VERSION (takes a few minutes once)" >&2
  go install "github.com/terraform-linters/tflint@$TFLINT_VERSION"
fi
[ "${1:-}" = install ] && exit 0

tf=deploy/terraform
mapfile -t files < <(find "$tf" -name '*.tf' -not -path '*/.terraform/*' | sort)
if [ ${#files[@]} -eq 0 ]; then
  echo "terraform-check: no .tf files under $tf" >&2
  exit 1
fi

echo "terraform-check: hclfmt (${#files[@]} files)" >&2
if ! hclfmt -check -require-no-change "${files[@]}" >/dev/null; then
  echo "terraform-check: run 'hclfmt -w FILE' (or terraform fmt) on the files named above" >&2
  exit 1
fi

echo "terraform-check: tflint" >&2
(cd "$tf" && tflint --recursive --config "$PWD/.tflint.hcl" --minimum-failure-severity=notice --no-color)

[ "${1:-}" = static ] && exit 0

echo "terraform-check: go checks" >&2
go test -count=1 ./deploy/terraform/
go test -count=1 -run '^TestTerraform' ./cmd/quotient/
