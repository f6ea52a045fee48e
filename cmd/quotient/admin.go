package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/quotientlabs/quotient/internal/tlsconfig"
	"github.com/quotientlabs/quotient/region/admin"
)

const adminUsage = `usage: quotient admin [--server URL] [--token TOKEN] COMMAND [flags] [args]

Commands (--server and --token may also come from QUOTIENT_SERVER and
QUOTIENT_TOKEN; they may be given before or after COMMAND; --tls-ca,
--tls-cert and --tls-key, or QUOTIENT_TLS_CA, QUOTIENT_TLS_CERT and
QUOTIENT_TLS_KEY, before COMMAND: the CA bundle the coordinator's HTTPS
certificate must chain to, and the client certificate the admin API may
require):
  list [--tier TIER]                      policies in force (those applying to TIER)
  get ID                                  the version in force of a policy
  history ID                              every version of a policy, newest first
  put ID FILE [--enforce] [--expected-version N]
                                          write a new version (shadow unless --enforce);
                                          without --expected-version the version in force is read first
  rollback ID --to N [--expected-version N]
                                          write a new version with version N's document
  override add --subject KEY --policy ID (--rate R [--burst B] | --limit L) --expires DURATION|RFC3339 [--reason TEXT]
  override remove (ID | --subject KEY --policy ID)
  override list [--subject KEY] [--policy ID] [--all]
  audit [--id ID] [--kind policy|override] [--author NAME] [--limit N]
  usage KEY                               a subject's state in every region (KEY as k:<api key>)`

// adminClient calls the admin API.
type adminClient struct {
	server, token string
	http          *http.Client
	env           environment
}

// runAdmin implements `quotient admin ...`.
func runAdmin(ctx context.Context, env environment, args []string) int {
	c := &adminClient{env: env, http: &http.Client{Timeout: 30 * time.Second}}
	fs := flag.NewFlagSet("admin", flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	fs.Usage = func() { fmt.Fprintln(env.stderr, adminUsage) }
	common := func(fs *flag.FlagSet) {
		fs.StringVar(&c.server, "server", "http://127.0.0.1:9090", "base URL of a coordinator's admin API")
		fs.StringVar(&c.token, "token", "", "bearer token (read role for reads, admin role for writes)")
	}
	common(fs)
	var tlsFiles tlsconfig.Client
	fs.StringVar(&tlsFiles.CAFile, "tls-ca", "", "PEM bundle of the CAs the coordinator's certificate must chain to (default: the system's roots)")
	fs.StringVar(&tlsFiles.CertFile, "tls-cert", "", "PEM client certificate, for an admin API with --admin-client-cert")
	fs.StringVar(&tlsFiles.KeyFile, "tls-key", "", "PEM key of --tls-cert")
	if err := parseFlags(fs, args, env.lookupEnv); err != nil {
		return 2
	}
	if tlsFiles != (tlsconfig.Client{}) {
		cfg, err := tlsFiles.Config()
		if err != nil {
			fmt.Fprintf(env.stderr, "quotient admin: --tls-ca/--tls-cert/--tls-key: %v\n", err)
			return 2
		}
		c.http.Transport = &http.Transport{TLSClientConfig: cfg, Proxy: http.ProxyFromEnvironment}
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return 2
	}
	cmd, rest := rest[0], rest[1:]
	if cmd == "override" {
		if len(rest) == 0 {
			fs.Usage()
			return 2
		}
		cmd, rest = "override "+rest[0], rest[1:]
	}
	sub := flag.NewFlagSet("admin "+cmd, flag.ContinueOnError)
	sub.SetOutput(env.stderr)
	sub.Usage = func() { fmt.Fprintln(env.stderr, adminUsage) }
	// The sub flag set re-reads --server and --token so they may follow
	// COMMAND; their defaults are what the first parse found.
	srv, tok := c.server, c.token
	sub.StringVar(&c.server, "server", srv, "base URL of a coordinator's admin API")
	sub.StringVar(&c.token, "token", tok, "bearer token")
	var (
		tier, subject, policy, expires, reason, kind, id, author string
		enforce, all                                             bool
		expected, to                                             int64
		rate, burst                                              float64
		limit                                                    int64
		auditLimit                                               int
	)
	switch cmd {
	case "list":
		sub.StringVar(&tier, "tier", "", "only policies that apply to this tier")
	case "put":
		sub.BoolVar(&enforce, "enforce", false, "enforce at once instead of starting in shadow mode")
		sub.Int64Var(&expected, "expected-version", -1, "version being replaced (0 to create); -1 reads it first")
	case "rollback":
		sub.Int64Var(&to, "to", 0, "version to restore (required)")
		sub.Int64Var(&expected, "expected-version", -1, "version in force being replaced; -1 reads it first")
	case "override add", "override remove", "override list":
		sub.StringVar(&subject, "subject", "", "subject key: k:<api key>, a:<account>, u:<user>, ip:<address>")
		sub.StringVar(&policy, "policy", "", "policy id")
		sub.Float64Var(&rate, "rate", 0, "rate_per_sec for bucket policies")
		sub.Float64Var(&burst, "burst", 0, "burst for bucket policies")
		sub.Int64Var(&limit, "limit", 0, "limit for window policies")
		sub.StringVar(&expires, "expires", "", "expiry: a duration from now (24h) or an RFC 3339 time")
		sub.StringVar(&reason, "reason", "", "why, for the audit log")
		sub.BoolVar(&all, "all", false, "include expired overrides")
	case "audit":
		sub.StringVar(&id, "id", "", "only this policy or override id")
		sub.StringVar(&kind, "kind", "", "policy or override")
		sub.StringVar(&author, "author", "", "only writes by this principal")
		sub.IntVar(&auditLimit, "limit", 0, "at most this many entries (default 100)")
	case "get", "history", "usage":
	default:
		fmt.Fprintf(env.stderr, "quotient admin: unknown command %q\n\n", cmd)
		fs.Usage()
		return 2
	}
	pos, err := parseInterleaved(sub, rest)
	if err != nil {
		return 2
	}
	need := map[string]int{"get": 1, "history": 1, "usage": 1, "put": 2, "rollback": 1, "list": 0, "audit": 0, "override add": 0, "override list": 0}
	if n, ok := need[cmd]; ok && len(pos) != n {
		fmt.Fprintf(env.stderr, "quotient admin %s: want %d argument(s), got %d\n", cmd, n, len(pos))
		return 2
	}
	c.server = strings.TrimRight(c.server, "/")
	switch cmd {
	case "list":
		q := url.Values{}
		if tier != "" {
			q.Set("tier", tier)
		}
		return c.call(ctx, "GET", "/v1/policies", q, nil)
	case "get":
		return c.call(ctx, "GET", "/v1/policies/"+url.PathEscape(pos[0]), nil, nil)
	case "history":
		return c.call(ctx, "GET", "/v1/policies/"+url.PathEscape(pos[0])+"/history", nil, nil)
	case "usage":
		return c.call(ctx, "GET", "/v1/keys/"+url.PathEscape(pos[0])+"/usage", nil, nil)
	case "put":
		return c.put(ctx, pos[0], pos[1], enforce, expected)
	case "rollback":
		if to < 1 {
			fmt.Fprintln(env.stderr, "quotient admin rollback: --to is required (the version to restore)")
			return 2
		}
		if expected < 0 {
			v, code := c.currentVersion(ctx, pos[0])
			if code != 0 {
				return code
			}
			expected = v
		}
		return c.call(ctx, "POST", "/v1/policies/"+url.PathEscape(pos[0])+"/rollback", nil, map[string]any{"to_version": to, "expected_version": expected})
	case "override add":
		exp, err := parseExpiry(expires, time.Now())
		if err != nil {
			fmt.Fprintf(env.stderr, "quotient admin override add: --expires: %v\n", err)
			return 2
		}
		body := admin.Override{Subject: subject, Policy: policy, RatePerSec: rate, Burst: burst, Limit: limit, ExpiresAt: exp, Reason: reason}
		return c.call(ctx, "POST", "/v1/overrides", nil, body)
	case "override remove":
		switch {
		case len(pos) == 1 && subject == "" && policy == "":
			id = pos[0]
		case len(pos) == 0 && subject != "" && policy != "":
			id = admin.OverrideID(policy, subject)
		default:
			fmt.Fprintln(env.stderr, "quotient admin override remove: give an override ID, or --subject and --policy")
			return 2
		}
		return c.call(ctx, "DELETE", "/v1/overrides/"+url.PathEscape(id), nil, nil)
	case "override list":
		q := url.Values{}
		if subject != "" {
			q.Set("subject", subject)
		}
		if policy != "" {
			q.Set("policy", policy)
		}
		if all {
			q.Set("include_expired", "true")
		}
		return c.call(ctx, "GET", "/v1/overrides", q, nil)
	case "audit":
		q := url.Values{}
		for k, v := range map[string]string{"id": id, "kind": kind, "author": author} {
			if v != "" {
				q.Set(k, v)
			}
		}
		if auditLimit > 0 {
			q.Set("limit", fmt.Sprint(auditLimit))
		}
		return c.call(ctx, "GET", "/v1/audit", q, nil)
	}
	return 2
}

// parseExpiry reads a duration from now or an RFC 3339 time.
func parseExpiry(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, fmt.Errorf("required")
	}
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(d).UTC().Truncate(time.Second), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither a duration (24h) nor an RFC 3339 time", s)
	}
	return t, nil
}

// put sends FILE (one policy document; id, version and mode are dropped:
// the server sets them) as a new version of id.
func (c *adminClient) put(ctx context.Context, id, file string, enforce bool, expected int64) int {
	data, err := os.ReadFile(file)
	if err != nil {
		fmt.Fprintf(c.env.stderr, "quotient admin put: %v\n", err)
		return 1
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(data, &doc); err != nil {
		fmt.Fprintf(c.env.stderr, "quotient admin put: %s: not one JSON policy object: %v\n", file, err)
		return 1
	}
	if raw, ok := doc["id"]; ok {
		var got string
		if json.Unmarshal(raw, &got) != nil || got != id {
			fmt.Fprintf(c.env.stderr, "quotient admin put: %s: id %s is not %q\n", file, raw, id)
			return 1
		}
	}
	if raw, ok := doc["mode"]; ok {
		fmt.Fprintf(c.env.stderr, "quotient admin put: ignoring mode %s in %s: a new version is shadow unless --enforce\n", raw, file)
	}
	delete(doc, "id")
	delete(doc, "version")
	delete(doc, "mode")
	if expected < 0 {
		v, code := c.currentVersion(ctx, id)
		if code != 0 {
			return code
		}
		expected = v
	}
	return c.call(ctx, "PUT", "/v1/policies/"+url.PathEscape(id), nil, map[string]any{"expected_version": expected, "enforce": enforce, "policy": doc})
}

// currentVersion reads the version in force of a policy (0 when none).
func (c *adminClient) currentVersion(ctx context.Context, id string) (int64, int) {
	status, body, err := c.do(ctx, "GET", "/v1/policies/"+url.PathEscape(id), nil, nil)
	if err != nil {
		fmt.Fprintf(c.env.stderr, "quotient admin: %v\n", err)
		return 0, 1
	}
	if status == http.StatusNotFound {
		return 0, 0
	}
	if status != http.StatusOK {
		c.printProblem(status, body)
		return 0, 1
	}
	var v struct {
		Version int64 `json:"version"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		fmt.Fprintf(c.env.stderr, "quotient admin: bad answer from %s: %v\n", c.server, err)
		return 0, 1
	}
	return v.Version, 0
}

func (c *adminClient) do(ctx context.Context, method, path string, q url.Values, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	u := c.server + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	res, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 16<<20))
	return res.StatusCode, b, err
}

// call performs one request and prints the answer: indented JSON on
// stdout (exit 0), or the problem on stderr (exit 1).
func (c *adminClient) call(ctx context.Context, method, path string, q url.Values, body any) int {
	status, b, err := c.do(ctx, method, path, q, body)
	if err != nil {
		fmt.Fprintf(c.env.stderr, "quotient admin: %v\n", err)
		return 1
	}
	if status >= 300 {
		c.printProblem(status, b)
		return 1
	}
	if len(bytes.TrimSpace(b)) == 0 {
		fmt.Fprintf(c.env.stdout, "%d %s\n", status, http.StatusText(status))
		return 0
	}
	var out bytes.Buffer
	if json.Indent(&out, b, "", "  ") != nil {
		out.Reset()
		out.Write(b)
	}
	fmt.Fprintln(c.env.stdout, out.String())
	return 0
}

func (c *adminClient) printProblem(status int, b []byte) {
	var p struct {
		Detail string `json:"detail"`
		Errors []struct {
			Field  string `json:"field"`
			Detail string `json:"detail"`
		} `json:"errors"`
	}
	if json.Unmarshal(b, &p) != nil || p.Detail == "" {
		fmt.Fprintf(c.env.stderr, "quotient admin: %d %s: %s\n", status, http.StatusText(status), bytes.TrimSpace(b))
		return
	}
	fmt.Fprintf(c.env.stderr, "quotient admin: %d %s: %s\n", status, http.StatusText(status), p.Detail)
	for _, e := range p.Errors {
		fmt.Fprintf(c.env.stderr, "  %s: %s\n", e.Field, e.Detail)
	}
}

// parseInterleaved parses flags given before, between or after positional
// arguments, and returns the positional ones.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}
