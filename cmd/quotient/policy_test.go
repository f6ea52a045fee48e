package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	env := environment{stdout: &out, stderr: &errb, lookupEnv: func(string) (string, bool) { return "", false }}
	code := run(context.Background(), env, args)
	return code, out.String(), errb.String()
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	return p
}

func TestPolicyValidateAcceptsTheSeedExample(t *testing.T) {
	// Seed design section 4.3, verbatim.
	seed := writeFile(t, "seed.json", `{"id": "pro-default", "version": 7, "match": {"tier": "pro", "routes": ["/v1/*"]}, "algorithm": "token_bucket", "rate_per_sec": 100, "burst": 200, "cost": {"POST /v1/exports": 10}, "on_store_failure": "open", "mode": "enforce"}`)
	code, out, errOut := runCLI(t, "policy", "validate", seed, "../../examples/policies.json")
	assert.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "seed.json: 1 valid policy")
	assert.Contains(t, out, "policies.json: 5 valid policies")
}

func TestPolicyValidateNamesTheField(t *testing.T) {
	broken := writeFile(t, "broken.json", `[
		{"id": "a", "algorithm": "token_bucket", "rate_per_sec": -1, "colour": "red"},
		{"id": "a", "algorithm": "fixed_window", "limit": 10, "window_s": 0}
	]`)
	code, _, errOut := runCLI(t, "policy", "validate", broken)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "broken.json: policies[0].colour: unknown field")
	assert.Contains(t, errOut, "broken.json: policies[1].window_s: must be between 1 and")
	assert.Contains(t, errOut, `broken.json: policies[1].id: duplicate id "a" (also policies[0])`)
}

func TestPolicyValidateUsage(t *testing.T) {
	code, _, errOut := runCLI(t, "policy")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "usage: quotient policy validate FILE")
	code, _, errOut = runCLI(t, "policy", "validate", filepath.Join(t.TempDir(), "missing.json"))
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "no such file")
	code, _, _ = runCLI(t, "nonsense")
	assert.Equal(t, 2, code)
}
