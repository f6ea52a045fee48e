package admin_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// seedDoc is the policy document of seed design 4.3, as users write it.
const seedDoc = `{"id": "pro-default", "version": 7, "match": {"tier": "pro", "routes": ["/v1/*"]}, "algorithm": "token_bucket", "rate_per_sec": 100, "burst": 200, "cost": {"POST /v1/exports": 10}, "on_store_failure": "open", "mode": "enforce"}`

// TestPutTheSeedDocument: PUT /v1/policies/{id} takes the document itself
// (curl -X PUT --data @pro.json), with If-Match / If-None-Match for
// optimistic concurrency, the document's version as a staleness check and
// the shadow-first rule: its mode "enforce" needs the reviewer's
// ?enforce=true.
func TestPutTheSeedDocument(t *testing.T) {
	e := newEnv(t, nil)
	r := e.do("PUT", "/v1/policies/pro-default", adminTok, seedDoc)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	m := r.json(t)
	assert.Equal(t, float64(1), m["version"], "the server numbers versions")
	assert.Equal(t, "shadow", m["mode"], "a new version starts in shadow without the reviewer's enforce")
	assert.Equal(t, `"1"`, r.header.Get("ETag"))

	r = e.doWith("PUT", "/v1/policies/pro-default?enforce=true", adminTok, seedDoc, map[string]string{"If-Match": `"1"`})
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, "enforce", r.json(t)["mode"])
	assert.Equal(t, `"2"`, r.header.Get("ETag"))

	// A stale If-Match: 412 with the version in force, nothing written.
	r = e.doWith("PUT", "/v1/policies/pro-default?enforce=true", adminTok, seedDoc, map[string]string{"If-Match": `"1"`})
	require.Equal(t, http.StatusPreconditionFailed, r.status, "%s", r.body)
	assert.Equal(t, float64(2), r.json(t)["current_version"])
	assert.Equal(t, `"2"`, r.header.Get("ETag"))
	// Create only, on an existing policy: 412.
	r = e.doWith("PUT", "/v1/policies/pro-default", adminTok, seedDoc, map[string]string{"If-None-Match": "*"})
	require.Equal(t, http.StatusPreconditionFailed, r.status, "%s", r.body)
	// A document edited from an older version (its own count not above
	// the version in force... once the server is past it).
	r = e.do("PUT", "/v1/policies/pro-default", adminTok, `{"version": 2, "algorithm": "token_bucket", "rate_per_sec": 100, "burst": 200}`)
	require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
	// A document that says shadow stays in shadow, whatever the reviewer.
	r = e.do("PUT", "/v1/policies/pro-default?enforce=true", adminTok, `{"algorithm": "token_bucket", "rate_per_sec": 50, "burst": 100, "mode": "shadow"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, "shadow", r.json(t)["mode"])
	assert.Equal(t, float64(3), r.json(t)["version"])

	// Bad input names the field and changes nothing.
	for body, field := range map[string]string{
		`{"algorithm": "token_bucket", "rate_per_sec": 1, "burst": 1, "mode": "loud"}`:  "mode",
		`{"algorithm": "token_bucket", "rate_per_sec": 1, "burst": 1, "colour": "red"}`: "colour",
		`{"algorithm": "token_bucket", "rate_per_sec": -1, "burst": 1}`:                 "rate_per_sec",
	} {
		r = e.do("PUT", "/v1/policies/pro-default", adminTok, body)
		require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
		assert.Contains(t, string(r.body), `"field":"`+field, body)
	}
	r = e.doWith("PUT", "/v1/policies/pro-default", adminTok, seedDoc, map[string]string{"If-Match": "latest"})
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
	r = e.do("GET", "/v1/policies/pro-default", readTok, "")
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, float64(3), r.json(t)["version"], "the refused writes changed nothing")
}
