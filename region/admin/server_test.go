package admin_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/region/admin"
)

// TestPolicyLifecycle: create (shadow), update to enforce, history, list by
// tier, rollback, delete; every write audited with before and after.
func TestPolicyLifecycle(t *testing.T) {
	e := newEnv(t, nil)
	r := e.do("PUT", "/v1/policies/pro-burst", adminTok, `{"expected_version":0,"policy":`+burstDoc+`}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	m := r.json(t)
	assert.Equal(t, "shadow", m["mode"])
	assert.Equal(t, float64(1), m["version"])
	assert.Equal(t, `"1"`, r.header.Get("ETag"))

	e.clock.Add(time.Minute)
	r = e.do("PUT", "/v1/policies/pro-burst", adminTok, `{"expected_version":1,"enforce":true,"policy":`+burstDoc+`}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, "enforce", r.json(t)["mode"])

	r = e.do("PUT", "/v1/policies/free-burst", adminTok, `{"expected_version":0,"policy":{"algorithm":"fixed_window","limit":100,"window_s":60,"match":{"tier":"free"}}}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)

	r = e.do("GET", "/v1/policies?tier=pro", readTok, "")
	require.Equal(t, http.StatusOK, r.status)
	pols := r.json(t)["policies"].([]any)
	require.Len(t, pols, 1)
	assert.Equal(t, "pro-burst", pols[0].(map[string]any)["id"])
	r = e.do("GET", "/v1/policies", readTok, "")
	assert.Len(t, r.json(t)["policies"], 2)

	r = e.do("GET", "/v1/policies/pro-burst/history", readTok, "")
	require.Equal(t, http.StatusOK, r.status)
	vs := r.json(t)["versions"].([]any)
	require.Len(t, vs, 2)
	assert.Equal(t, "enforce", vs[0].(map[string]any)["mode"])
	assert.Equal(t, "shadow", vs[1].(map[string]any)["mode"])

	r = e.do("POST", "/v1/policies/pro-burst/rollback", adminTok, `{"to_version":1,"expected_version":2}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	m = r.json(t)
	assert.Equal(t, float64(3), m["version"])
	assert.Equal(t, "shadow", m["mode"], "a rollback restores the old document, mode included")

	r = e.do("GET", "/v1/audit?id=pro-burst", readTok, "")
	require.Equal(t, http.StatusOK, r.status)
	ents := r.json(t)["entries"].([]any)
	require.Len(t, ents, 3)
	last := ents[0].(map[string]any)
	assert.Equal(t, "alice", last["author"])
	assert.Equal(t, float64(3), last["version"])
	assert.Contains(t, fmt.Sprint(last["before"]), "enforce")
	assert.Contains(t, fmt.Sprint(last["after"]), "shadow")
	assert.Nil(t, ents[2].(map[string]any)["before"], "a create has no before")

	r = e.do("DELETE", "/v1/policies/pro-burst?expected_version=3", adminTok, "")
	require.Equal(t, http.StatusNoContent, r.status, "%s", r.body)
	assert.Equal(t, http.StatusNotFound, e.do("GET", "/v1/policies/pro-burst", readTok, "").status)
	r = e.do("GET", "/v1/audit?id=pro-burst&limit=1", readTok, "")
	assert.Equal(t, "delete", r.json(t)["entries"].([]any)[0].(map[string]any)["action"])
	assert.Len(t, e.log.records(), 5, "every write went to the log")
}

// TestAuthorization: no token, unknown token, wrong role; reads with the
// read role; nothing written by a refused request.
func TestAuthorization(t *testing.T) {
	e := newEnv(t, nil)
	put := `{"expected_version":0,"policy":` + burstDoc + `}`
	cases := []struct {
		name, method, path, token, body string
		status                          int
	}{
		{"no token read", "GET", "/v1/policies", "", "", http.StatusUnauthorized},
		{"no token write", "PUT", "/v1/policies/p", "", put, http.StatusUnauthorized},
		{"unknown token", "PUT", "/v1/policies/p", "not-a-valid-token-at-all", put, http.StatusUnauthorized},
		{"read role writes", "PUT", "/v1/policies/p", readTok, put, http.StatusForbidden},
		{"read role overrides", "POST", "/v1/overrides", readTok, `{}`, http.StatusForbidden},
		{"read role deletes", "DELETE", "/v1/overrides/x", readTok, "", http.StatusForbidden},
		{"read role reads", "GET", "/v1/policies", readTok, "", http.StatusOK},
		{"read role reads audit", "GET", "/v1/audit", readTok, "", http.StatusOK},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := e.do(c.method, c.path, c.token, c.body)
			assert.Equal(t, c.status, r.status, "%s", r.body)
			if c.status >= 400 {
				assert.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
				assert.Equal(t, float64(c.status), r.json(t)["status"])
			}
			if c.status == http.StatusUnauthorized {
				assert.Contains(t, r.header.Get("WWW-Authenticate"), "Bearer")
			}
		})
	}
	assert.Empty(t, e.log.records())
	assert.Empty(t, e.cat.Audit(admin.AuditFilter{}))
}

// TestBadInput: every kind of bad input is a 4xx problem naming what was
// wrong, and changes nothing.
func TestBadInput(t *testing.T) {
	e := newEnv(t, nil)
	r := e.do("PUT", "/v1/policies/pro-burst", adminTok, `{"expected_version":0,"policy":`+burstDoc+`}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	before := len(e.log.records())

	big := `{"expected_version":1,"policy":{"algorithm":"token_bucket","rate_per_sec":1,"description":"` + strings.Repeat("x", 5000) + `"}}`
	cases := []struct {
		name, method, path, body string
		status                   int
		field                    string // expected in errors[].field or detail
	}{
		{"malformed json", "PUT", "/v1/policies/pro-burst", `{"expected_version":1,`, 400, "body"},
		{"trailing data", "PUT", "/v1/policies/pro-burst", `{"expected_version":1,"policy":` + burstDoc + `} {}`, 400, "body"},
		{"unknown field", "PUT", "/v1/policies/pro-burst", `{"expected_version":1,"colour":"red","policy":` + burstDoc + `}`, 400, "colour"},
		{"unknown policy field", "PUT", "/v1/policies/pro-burst", `{"expected_version":1,"policy":{"algorithm":"token_bucket","rate_per_sec":1,"bogus":1}}`, 400, "policy.bogus"},
		{"duplicate field", "PUT", "/v1/policies/pro-burst", `{"expected_version":1,"expected_version":1,"policy":` + burstDoc + `}`, 400, "body"},
		{"wrong type", "PUT", "/v1/policies/pro-burst", `{"expected_version":"one","policy":` + burstDoc + `}`, 400, "expected_version"},
		{"invalid policy", "PUT", "/v1/policies/pro-burst", `{"expected_version":1,"policy":{"algorithm":"token_bucket","rate_per_sec":-3}}`, 400, "policy.rate_per_sec"},
		{"missing expected_version", "PUT", "/v1/policies/pro-burst", `{"policy":` + burstDoc + `}`, 400, "expected_version"},
		{"version in document", "PUT", "/v1/policies/pro-burst", `{"expected_version":1,"policy":{"version":7,"algorithm":"token_bucket","rate_per_sec":1}}`, 400, "policy.version"},
		{"mode in document", "PUT", "/v1/policies/pro-burst", `{"expected_version":1,"policy":{"mode":"enforce","algorithm":"token_bucket","rate_per_sec":1}}`, 400, "policy.mode"},
		{"other id in document", "PUT", "/v1/policies/pro-burst", `{"expected_version":1,"policy":{"id":"other","algorithm":"token_bucket","rate_per_sec":1}}`, 400, "policy.id"},
		{"bad id in path", "PUT", "/v1/policies/bad%20id", `{"expected_version":0,"policy":` + burstDoc + `}`, 400, "id"},
		{"version conflict", "PUT", "/v1/policies/pro-burst", `{"expected_version":0,"policy":` + burstDoc + `}`, 409, ""},
		{"stale rollback", "POST", "/v1/policies/pro-burst/rollback", `{"to_version":1,"expected_version":5}`, 409, ""},
		{"rollback to missing version", "POST", "/v1/policies/pro-burst/rollback", `{"to_version":9,"expected_version":1}`, 400, "to_version"},
		{"oversized body", "PUT", "/v1/policies/pro-burst", big, 413, ""},
		{"bad query parameter", "GET", "/v1/policies?teir=pro", "", 400, "teir"},
		{"bad audit limit", "GET", "/v1/audit?limit=0", "", 400, "limit"},
		{"bad audit since", "GET", "/v1/audit?since=yesterday", "", 400, "since"},
		{"bad expected_version param", "DELETE", "/v1/policies/pro-burst?expected_version=x", "", 400, "expected_version"},
		{"delete without expected_version", "DELETE", "/v1/policies/pro-burst", "", 400, "expected_version"},
		{"override unknown policy", "POST", "/v1/overrides", `{"subject":"k:abc","policy":"nope","rate_per_sec":5,"expires_at":"2025-03-02T00:00:00Z"}`, 400, "policy"},
		{"override bad subject", "POST", "/v1/overrides", `{"subject":"abc","policy":"pro-burst","rate_per_sec":5,"expires_at":"2025-03-02T00:00:00Z"}`, 400, "subject"},
		{"override wrong subject kind", "POST", "/v1/overrides", `{"subject":"u:abc","policy":"pro-burst","rate_per_sec":5,"expires_at":"2025-03-02T00:00:00Z"}`, 400, "subject"},
		{"override expired at creation", "POST", "/v1/overrides", `{"subject":"k:abc","policy":"pro-burst","rate_per_sec":5,"expires_at":"2025-03-01T11:00:00Z"}`, 400, "expires_at"},
		{"override no limits", "POST", "/v1/overrides", `{"subject":"k:abc","policy":"pro-burst","expires_at":"2025-03-02T00:00:00Z"}`, 400, "limit"},
		{"override wrong algorithm param", "POST", "/v1/overrides", `{"subject":"k:abc","policy":"pro-burst","limit":5,"expires_at":"2025-03-02T00:00:00Z"}`, 400, "limit"},
		{"override bad time", "POST", "/v1/overrides", `{"subject":"k:abc","policy":"pro-burst","rate_per_sec":5,"expires_at":"tomorrow"}`, 400, "body"},
		{"override sets id", "POST", "/v1/overrides", `{"id":"x","subject":"k:abc","policy":"pro-burst","rate_per_sec":5,"expires_at":"2025-03-02T00:00:00Z"}`, 400, "id"},
		{"wrong method", "PATCH", "/v1/policies/pro-burst", `{}`, 405, ""},
		{"unknown path", "GET", "/v1/nothing", "", 404, ""},
		{"bad key", "GET", "/v1/keys/zz:abc/usage", "", 400, "key"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := e.do(c.method, c.path, adminTok, c.body)
			require.Equal(t, c.status, r.status, "%s", r.body)
			assert.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
			m := r.json(t)
			assert.Equal(t, float64(c.status), m["status"])
			assert.NotEmpty(t, m["detail"])
			if c.field != "" {
				errs, _ := m["errors"].([]any)
				var fields []string
				for _, f := range errs {
					fields = append(fields, f.(map[string]any)["field"].(string))
				}
				assert.Contains(t, fields, c.field, "%s", r.body)
			}
			if c.status == 409 {
				assert.Equal(t, float64(1), m["current_version"])
			}
		})
	}
	assert.Len(t, e.log.records(), before, "bad input wrote nothing")
	cur, ok := e.cat.Current(admin.KindPolicy, "pro-burst")
	require.True(t, ok)
	assert.Equal(t, int64(1), cur.Version)
	assert.Len(t, e.cat.Audit(admin.AuditFilter{}), 1)
}

// TestLogDownChangesNothing: a write the log does not acknowledge is a 503
// and leaves the catalog as it was.
func TestLogDownChangesNothing(t *testing.T) {
	e := newEnv(t, nil)
	e.log.fail = true
	r := e.do("PUT", "/v1/policies/p1", adminTok, `{"expected_version":0,"policy":`+burstDoc+`}`)
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	assert.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
	_, ok := e.cat.Current(admin.KindPolicy, "p1")
	assert.False(t, ok)
}

// TestOverrideExpiry: an override is listed while active, disappears from
// the active list when it expires (by the injected clock), can be
// replaced and removed.
func TestOverrideExpiry(t *testing.T) {
	e := newEnv(t, nil)
	require.Equal(t, 201, e.do("PUT", "/v1/policies/pro-burst", adminTok, `{"expected_version":0,"enforce":true,"policy":`+burstDoc+`}`).status)
	r := e.do("POST", "/v1/overrides", adminTok, `{"subject":"k:vip","policy":"pro-burst","rate_per_sec":100,"burst":200,"expires_at":"2025-03-01T13:00:00Z","reason":"launch day"}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	id := r.json(t)["id"].(string)
	assert.Equal(t, admin.OverrideID("pro-burst", "k:vip"), id)
	assert.Equal(t, "/v1/overrides/"+id, r.header.Get("Location"))

	list := func(q string) []any {
		r := e.do("GET", "/v1/overrides"+q, readTok, "")
		require.Equal(t, 200, r.status, "%s", r.body)
		return r.json(t)["overrides"].([]any)
	}
	require.Len(t, list("?subject=k:vip"), 1)
	e.clock.Add(59 * time.Minute)
	require.Len(t, list(""), 1, "active one minute before expiry")
	e.clock.Add(time.Minute)
	assert.Empty(t, list(""), "expired at expires_at")
	all := list("?include_expired=true")
	require.Len(t, all, 1)
	assert.Equal(t, false, all[0].(map[string]any)["active"])

	// Posting again renews it as the next version of the same override.
	r = e.do("POST", "/v1/overrides", adminTok, `{"subject":"k:vip","policy":"pro-burst","rate_per_sec":50,"expires_at":"2025-03-02T00:00:00Z"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, float64(2), r.json(t)["version"])
	require.Len(t, list(""), 1)

	require.Equal(t, http.StatusNoContent, e.do("DELETE", "/v1/overrides/"+id, adminTok, "").status)
	assert.Empty(t, list("?include_expired=true"))
	assert.Equal(t, http.StatusNotFound, e.do("DELETE", "/v1/overrides/"+id, adminTok, "").status)
	ents := e.cat.Audit(admin.AuditFilter{Kind: admin.KindOverride})
	require.Len(t, ents, 3)
	assert.Equal(t, "delete", ents[0].Action)
}
