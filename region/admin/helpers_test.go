package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/region/admin"
)

// memLog is an in-memory Log that can be made to fail.
type memLog struct {
	mu   sync.Mutex
	recs []admin.Record
	fail bool
}

var _ admin.Log = (*memLog)(nil)

func (l *memLog) Append(_ context.Context, r admin.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fail {
		return errors.New("memlog: down")
	}
	l.recs = append(l.recs, r)
	return nil
}

func (l *memLog) records() []admin.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]admin.Record(nil), l.recs...)
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

const (
	adminTok = "admin-token-0123456789"
	readTok  = "read-token-0123456789ab"
)

func testTokens(t *testing.T) *admin.Tokens {
	toks, err := admin.ParseTokens([]byte("# test\nalice admin " + adminTok + "\nbob read " + readTok + "\n"))
	require.NoError(t, err)
	return toks
}

type env struct {
	t     *testing.T
	srv   *httptest.Server
	cat   *admin.Catalog
	log   *memLog
	clock *fakeClock
}

func newEnv(t *testing.T, usage admin.UsageReader) *env {
	e := &env{t: t, cat: admin.NewCatalog(), log: &memLog{}, clock: &fakeClock{now: t0}}
	s, err := admin.NewServer(admin.Config{Catalog: e.cat, Log: e.log, Tokens: testTokens(t), Clock: e.clock, Usage: usage, MaxBodyBytes: 4096})
	require.NoError(t, err)
	e.srv = httptest.NewServer(s)
	t.Cleanup(e.srv.Close)
	return e
}

type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(r.body, &m), "body %s", r.body)
	return m
}

func (e *env) do(method, path, token, body string) resp {
	e.t.Helper()
	return e.doWith(method, path, token, body, nil)
}

// doWith is do with extra request headers.
func (e *env) doWith(method, path, token, body string, hdr map[string]string) resp {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, e.srv.URL+path, rd)
	require.NoError(e.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(e.t, err)
	return resp{status: res.StatusCode, header: res.Header, body: b}
}

const burstDoc = `{"algorithm":"token_bucket","rate_per_sec":10,"burst":20,"match":{"tier":"pro"}}`

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func (r recordAlias) withID(id string) admin.Record { r.ID = id; return admin.Record(r) }

type recordAlias admin.Record
