package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/region/admin"
)

type cliLog struct {
	mu   sync.Mutex
	recs []admin.Record
}

func (l *cliLog) Append(_ context.Context, r admin.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r)
	return nil
}

// TestAdminCLI drives every subcommand against a real admin.Server, with
// --server and --token from the environment.
func TestAdminCLI(t *testing.T) {
	toks, err := admin.ParseTokens([]byte("ops admin admin-token-0123456789\nviewer read read-token-0123456789ab\n"))
	require.NoError(t, err)
	srv, err := admin.NewServer(admin.Config{Catalog: admin.NewCatalog(), Log: &cliLog{}, Tokens: toks})
	require.NoError(t, err)
	hs := httptest.NewServer(srv)
	defer hs.Close()
	envVars := map[string]string{"QUOTIENT_SERVER": hs.URL, "QUOTIENT_TOKEN": "admin-token-0123456789"}
	cli := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		env := environment{stdout: &out, stderr: &errb, lookupEnv: func(k string) (string, bool) { v, ok := envVars[k]; return v, ok }}
		code := run(context.Background(), env, append([]string{"admin"}, args...))
		return code, out.String(), errb.String()
	}
	file := writeFile(t, "pro.json", `{"id":"pro-burst","version":9,"mode":"enforce","algorithm":"token_bucket","rate_per_sec":10,"match":{"tier":"pro"}}`)

	code, out, errOut := cli("put", "pro-burst", file)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, `"mode": "shadow"`)
	assert.Contains(t, errOut, "ignoring mode")
	code, out, errOut = cli("put", "--enforce", "pro-burst", file)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, `"version": 2`)
	assert.Contains(t, out, `"mode": "enforce"`)

	code, _, errOut = cli("put", "--expected-version", "1", "pro-burst", file)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "409 Conflict")

	code, out, _ = cli("list", "--tier", "pro")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "pro-burst")
	code, out, _ = cli("get", "pro-burst")
	require.Equal(t, 0, code)
	assert.Contains(t, out, `"version": 2`)
	code, out, _ = cli("history", "pro-burst")
	require.Equal(t, 0, code)
	assert.Contains(t, out, `"version": 1`)
	code, out, errOut = cli("rollback", "pro-burst", "--to", "1")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, `"version": 3`)
	assert.Contains(t, out, `"mode": "shadow"`)

	code, out, errOut = cli("override", "add", "--subject", "k:vip", "--policy", "pro-burst", "--rate", "100", "--expires", "24h", "--reason", "launch")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, `"active": true`)
	code, out, _ = cli("override", "list", "--subject", "k:vip")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "launch")
	code, out, errOut = cli("override", "remove", "--subject", "k:vip", "--policy", "pro-burst")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "204")

	code, out, _ = cli("audit", "--kind", "override")
	require.Equal(t, 0, code)
	assert.Contains(t, out, `"action": "delete"`)
	assert.Contains(t, out, `"author": "ops"`)

	// Validation errors name the field; the read role cannot write.
	code, _, errOut = cli("override", "add", "--subject", "k:vip", "--policy", "pro-burst", "--limit", "5", "--expires", "1h")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "limit:")
	code, _, errOut = cli("--token", "read-token-0123456789ab", "put", "pro-burst", file)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "403 Forbidden")
	code, _, errOut = cli("frobnicate")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "unknown command")
}
