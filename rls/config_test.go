package rls

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/limiter"
)

func loadCorpus(t *testing.T) *Config {
	t.Helper()
	c, err := LoadDir("testdata/corpus", ParseOptions{})
	require.NoError(t, err)
	return c
}

func es(kv ...string) []Entry {
	var out []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func TestCorpusLoads(t *testing.T) {
	c := loadCorpus(t)
	assert.Equal(t, []string{"edge", "sms", "soft", "store_qps"}, c.Domains())
	assert.Equal(t, []string{"db.yaml", "edge.yaml", "sms.yaml", "soft.yaml"}, c.Files())
	assert.Equal(t, 16, c.Rules())
}

func TestLookupMatchesEnvoyproxy(t *testing.T) {
	c := loadCorpus(t)
	type want struct {
		path      string // "" when no rule applies
		rpu       uint32
		unit      Unit
		values    []string
		unlimited bool
		shadow    bool
	}
	cases := []struct {
		name    string
		domain  string
		entries []Entry
		want    want
	}{
		{"exact value", "store_qps", es("table", "orders"), want{path: "store_qps.table_orders", rpu: 3, unit: Second, values: []string{"orders"}}},
		{"other exact value", "store_qps", es("table", "fallback"), want{path: "store_qps.table_fallback", rpu: 7, unit: Second, values: []string{"fallback"}}},
		{"unknown value, no key-only rule", "store_qps", es("table", "users"), want{}},
		{"unknown domain", "nope", es("table", "orders"), want{}},
		{"nested key without value", "sms", es("kind", "promo", "phone", "555"), want{path: "sms.kind_promo.phone", rpu: 2, unit: Day, values: []string{"promo", "555"}}},
		{"key alone at top", "sms", es("phone", "555"), want{path: "sms.phone", rpu: 4, unit: Day, values: []string{"555"}}},
		{"placeholder without limit", "sms", es("kind", "promo"), want{}},
		{"most specific wins", "edge", es("client_ip", "192.0.2.66"), want{path: "edge.client_ip_192.0.2.66", rpu: 0, unit: Day, values: []string{"192.0.2.66"}}},
		{"default per value", "edge", es("client_ip", "192.0.2.1"), want{path: "edge.client_ip", rpu: 5, unit: Day, values: []string{"192.0.2.1"}}},
		{"request deeper than config", "edge", es("client_ip", "192.0.2.1", "x", "y"), want{}},
		{"config deeper than request", "edge", es("route", "deep"), want{}},
		{"same depth", "edge", es("route", "deep", "method", "GET"), want{path: "edge.route_deep.method", rpu: 2, unit: Hour, values: []string{"deep", "GET"}}},
		{"unlimited", "edge", es("health", "x"), want{path: "edge.health", unlimited: true, values: []string{"x"}}},
		{"week, unit in upper case", "edge", es("batch", "b"), want{path: "edge.batch", rpu: 3, unit: Week, values: []string{"b"}}},
		{"shadow", "soft", es("app", "a", "tenant", "trial"), want{path: "soft.app.tenant_trial", rpu: 1, unit: Day, shadow: true, values: []string{"a", "trial"}}},
		{"wildcard", "soft", es("path", "/api/v1/users"), want{path: "soft.path_/api/*", rpu: 2, unit: Day, values: []string{"/api/v1/users"}}},
		{"wildcard prefix itself", "soft", es("path", "/api/"), want{path: "soft.path_/api/*", rpu: 2, unit: Day, values: []string{"/api/"}}},
		{"wildcard not matching", "soft", es("path", "/other"), want{}},
		{"share_threshold counts under the pattern", "soft", es("path", "/shared/a"), want{path: "soft.path_/shared/*", rpu: 2, unit: Day, values: []string{"/shared/*"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := c.Lookup(tc.domain, tc.entries)
			if tc.want.path == "" {
				assert.Nil(t, m.Rule)
				return
			}
			require.NotNil(t, m.Rule)
			assert.Equal(t, tc.want.path, m.Rule.Path)
			assert.Equal(t, tc.want.unlimited, m.Rule.Unlimited)
			assert.Equal(t, tc.want.shadow, m.Rule.Shadow)
			assert.Equal(t, tc.want.values, m.Values)
			if tc.want.unlimited {
				assert.Nil(t, m.Rule.Policy())
				return
			}
			assert.Equal(t, tc.want.rpu, m.Rule.RequestsPerUnit)
			assert.Equal(t, tc.want.unit, m.Rule.Unit)
			p := m.Rule.Policy()
			if tc.want.rpu == 0 {
				assert.Nil(t, p, "0 per unit is always over limit, never a store call")
				return
			}
			require.NotNil(t, p)
			assert.Equal(t, limiter.FixedWindow, p.Algorithm)
			assert.Equal(t, int64(tc.want.rpu), p.Limit)
			assert.Equal(t, tc.want.unit.Seconds(), p.WindowSec)
			if tc.want.shadow {
				assert.Equal(t, limiter.Shadow, p.Mode)
			} else {
				assert.Equal(t, limiter.Enforce, p.Mode)
			}
		})
	}
}

func TestReplacesAndNames(t *testing.T) {
	c := loadCorpus(t)
	red := c.Lookup("soft", es("team", "red", "login", "alice")).Rule
	blue := c.Lookup("soft", es("team", "blue", "login", "alice")).Rule
	require.NotNil(t, red)
	require.NotNil(t, blue)
	assert.Equal(t, "alice_red", red.Name)
	assert.Equal(t, []string{"alice_red"}, blue.Replaces)
	assert.True(t, c.Lookup("soft", es("sku", "x")).Rule.DetailedMetric)
}

func TestUnitSeconds(t *testing.T) {
	// envoyproxy/ratelimit's dividers: a month is 30 days, a year 365.
	assert.Equal(t, map[Unit]int64{Second: 1, Minute: 60, Hour: 3600, Day: 86400, Week: 604800, Month: 2592000, Year: 31536000},
		map[Unit]int64{Second: Second.Seconds(), Minute: Minute.Seconds(), Hour: Hour.Seconds(), Day: Day.Seconds(), Week: Week.Seconds(), Month: Month.Seconds(), Year: Year.Seconds()})
	assert.Zero(t, Unit("fortnight").Seconds())
}

func TestPolicyIDs(t *testing.T) {
	assert.Equal(t, "store_qps.table_orders", policyID("store_qps.table_orders"))
	a, b := policyID("soft.path_/api/*"), policyID("soft.path_/api/+")
	assert.NotEqual(t, a, b, "paths that differ only in invalid characters get different ids")
	assert.Regexp(t, `^[A-Za-z0-9._-]{1,64}$`, a)
	long := policyID(string(make([]byte, 300)))
	assert.Regexp(t, `^[A-Za-z0-9._-]{1,64}$`, long)
}

func TestParseErrorsNameFileAndPath(t *testing.T) {
	cases := []struct {
		name, yaml, path, msg string
	}{
		{"unknown top-level field", "domain: d\nlimits: []\n", "limits", "unknown field"},
		{"unknown descriptor field", "domain: d\ndescriptors:\n  - key: k\n    rate: 1\n", "descriptors[0].rate", "unknown field"},
		{"unknown rate_limit field", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 2}\n", "descriptors[0].rate_limit.burst", "unknown field"},
		{"nested unknown field", "domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: j\n        algorithm: x\n", "descriptors[0].descriptors[0].algorithm", "unknown field"},
		{"empty domain", "domain: \"\"\n", "domain", "must not be empty"},
		{"no domain", "descriptors: []\n", "domain", "required"},
		{"empty key", "domain: d\ndescriptors:\n  - value: v\n", "descriptors[0].key", "required"},
		{"bad unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", "descriptors[0].rate_limit.unit", "invalid unit \"fortnight\""},
		{"missing unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}\n", "descriptors[0].rate_limit.unit", "required"},
		{"unit with unlimited", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n", "descriptors[0].rate_limit.unit", "unlimited"},
		{"negative rpu", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n", "descriptors[0].rate_limit.requests_per_unit", "whole number"},
		{"rpu not a number", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: lots}\n", "descriptors[0].rate_limit.requests_per_unit", "whole number"},
		{"shadow not a bool", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n", "descriptors[0].shadow_mode", "true or false"},
		{"duplicate descriptor", "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n", "descriptors[1]", "duplicate descriptor d.k_v"},
		{"empty replaces name", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: \"\"}]}\n", "descriptors[0].rate_limit.replaces[0].name", "required"},
		{"replaces itself", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {name: a, unit: second, requests_per_unit: 1, replaces: [{name: a}]}\n", "descriptors[0].rate_limit.replaces[0].name", "itself"},
		{"repeated field", "domain: d\ndomain: e\n", "domain", "twice"},
		{"not a mapping", "- a\n- b\n", "", "want a mapping"},
		{"not YAML", "domain: [\n", "", "not YAML"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]File{{Name: "config/x.yaml", Data: []byte(tc.yaml)}}, ParseOptions{})
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalidConfig)
			var ce *ConfigError
			require.True(t, errors.As(err, &ce), "%T %v", err, err)
			assert.Equal(t, "config/x.yaml", ce.File)
			assert.Equal(t, tc.path, ce.Path)
			assert.Contains(t, ce.Msg, tc.msg)
			assert.Contains(t, err.Error(), "config/x.yaml")
		})
	}
}

// aliasBomb is a small file whose aliases expand to 3^14 (4.8 million)
// descriptors at the deepest level.
func aliasBomb() string {
	l := "[{key: k}, {key: j}, {key: m}]"
	for i := 1; i < MaxEntries-1; i++ {
		l = fmt.Sprintf("[{key: k, descriptors: &a%d %s}, {key: j, descriptors: *a%d}, {key: m, descriptors: *a%d}]", i, l, i, i)
	}
	return "domain: d\ndescriptors: " + l + "\n"
}

func TestAliasBombIsBounded(t *testing.T) {
	bomb := aliasBomb()
	require.Less(t, len(bomb), 2000)
	_, err := Parse([]File{{Name: "bomb.yaml", Data: []byte(bomb)}}, ParseOptions{})
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "more than 20000 descriptors (YAML aliases included)")
}

func TestDuplicateDomainAndMerge(t *testing.T) {
	a := File{Name: "a.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: x\n    rate_limit: {unit: second, requests_per_unit: 1}\n")}
	b := File{Name: "b.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: y\n    rate_limit: {unit: second, requests_per_unit: 2}\n")}
	_, err := Parse([]File{a, b}, ParseOptions{})
	require.ErrorContains(t, err, "b.yaml: domain: duplicate domain \"d\"")
	c, err := Parse([]File{a, b}, ParseOptions{MergeDomains: true})
	require.NoError(t, err)
	assert.NotNil(t, c.Lookup("d", es("x", "1")).Rule)
	assert.NotNil(t, c.Lookup("d", es("y", "1")).Rule)
	_, err = Parse([]File{a, a}, ParseOptions{MergeDomains: true})
	require.ErrorContains(t, err, "duplicate descriptor d.x")
}

func writeFile(t *testing.T, path, data string, mod time.Time) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(data), 0o644))
	require.NoError(t, os.Chtimes(path, mod, mod))
}

func TestWatcherKeepsLastGood(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: d\ndescriptors:\n  - key: x\n    rate_limit: {unit: second, requests_per_unit: 1}\n", t0)
	writeFile(t, filepath.Join(dir, ".swap.yaml"), "not: [yaml", t0)
	writeFile(t, filepath.Join(dir, "notes.txt"), "ignored", t0)
	var applied []*Config
	w, err := NewWatcher(dir, ParseOptions{}, func(c *Config) error { applied = append(applied, c); return nil }, nil)
	require.NoError(t, err)
	require.Len(t, applied, 1)
	assert.False(t, w.Check(), "nothing changed")

	// A broken edit keeps the configuration in force.
	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: d\ndescriptors:\n  - key: x\n    rate_limit: {unit: eon, requests_per_unit: 1}\n", t0.Add(time.Second))
	assert.False(t, w.Check())
	require.Len(t, applied, 1)
	require.ErrorContains(t, w.LastError(), "a.yaml: descriptors[0].rate_limit.unit: invalid unit \"eon\"")
	assert.Same(t, applied[0], w.Current())
	assert.NotNil(t, w.Current().Lookup("d", es("x", "1")).Rule)

	// A fix in a subdirectory file and a new file load.
	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: d\ndescriptors:\n  - key: x\n    rate_limit: {unit: second, requests_per_unit: 9}\n", t0.Add(2*time.Second))
	writeFile(t, filepath.Join(dir, "sub", "b.yml"), "domain: e\n", t0)
	assert.True(t, w.Check())
	require.Len(t, applied, 2)
	require.NoError(t, w.LastError())
	assert.Equal(t, uint32(9), applied[1].Lookup("d", es("x", "1")).Rule.RequestsPerUnit)
	assert.Equal(t, []string{"d", "e"}, applied[1].Domains())

	// Removing every file is an error too: the last good stays.
	require.NoError(t, os.Remove(filepath.Join(dir, "a.yaml")))
	require.NoError(t, os.RemoveAll(filepath.Join(dir, "sub")))
	assert.False(t, w.Check())
	require.Error(t, w.LastError())
	assert.Same(t, applied[1], w.Current())
}

func TestNewWatcherFailsWithoutGoodConfig(t *testing.T) {
	dir := t.TempDir()
	_, err := NewWatcher(dir, ParseOptions{}, func(*Config) error { return nil }, nil)
	require.ErrorContains(t, err, "no *.yaml or *.yml file")
	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: \"\"\n", time.Now())
	_, err = NewWatcher(dir, ParseOptions{}, func(*Config) error { return nil }, nil)
	require.ErrorContains(t, err, "a.yaml: domain: must not be empty")
}

func FuzzParse(f *testing.F) {
	entries, _ := os.ReadDir("testdata/corpus")
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join("testdata/corpus", e.Name()))
		if err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte("domain: d\ndescriptors: &a\n  - key: k\n    descriptors: *a\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    value: v*\n    share_threshold: true\n    rate_limit: {unit: year, requests_per_unit: 4294967295}\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {policy: p.1, name: n}\n  - key: j\n    rate_limit: {policy: p.1, replaces: [{name: n}]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		start := time.Now()
		c, err := Parse([]File{{Name: "f.yaml", Data: data}}, ParseOptions{})
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("parsing %d bytes took %v", len(data), d)
		}
		if err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, ErrInvalidConfig) || ce.File != "f.yaml" {
				t.Fatalf("error without file and path: %T %v", err, err)
			}
			return
		}
		// Every loaded rule with a limit has a valid policy; lookups of
		// any domain never panic.
		for _, d := range c.Domains() {
			var walk func(n *node, depth int)
			walk = func(n *node, depth int) {
				if depth > MaxEntries+1 {
					t.Fatalf("tree deeper than %d", MaxEntries)
				}
				children := make([]*node, 0)
				for _, ch := range n.exact {
					children = append(children, ch)
				}
				for _, ch := range n.keyOnly {
					children = append(children, ch)
				}
				children = append(children, n.wildcards...)
				for _, ch := range children {
					if r := ch.rule; r != nil {
						hasPolicy := r.policy != nil
						wantPolicy := r.PolicyID == "" && !r.Unlimited && r.RequestsPerUnit > 0
						if hasPolicy != wantPolicy {
							t.Fatalf("rule %s: policy %v, want %v", r.Path, hasPolicy, wantPolicy)
						}
						if r.PolicyID != "" && !slices.Contains(c.PolicyIDs(), r.PolicyID) {
							t.Fatalf("rule %s names policy %q, not in PolicyIDs %v", r.Path, r.PolicyID, c.PolicyIDs())
						}
					}
					walk(ch, depth+1)
				}
			}
			walk(c.domains[d], 0)
			c.Lookup(d, es("k", "v", "k", "v"))
		}
	})
}

// The shipped example loads and means what its comments say.
func TestExampleConfig(t *testing.T) {
	c, err := LoadDir(filepath.Join("..", "examples", "envoy", "runtime", "ratelimit", DefaultAppDirectory), ParseOptions{})
	require.NoError(t, err)
	assert.Equal(t, uint32(100), c.Lookup("edge", es("remote_address", "203.0.113.9")).Rule.RequestsPerUnit)
	assert.Nil(t, c.Lookup("edge", es("remote_address", "192.0.2.66")).Rule.Policy(), "blocked")
	a := c.Lookup("edge", es("api_key", "k1", "path", "/api/v1/a"))
	b := c.Lookup("edge", es("api_key", "k1", "path", "/api/v2/b"))
	require.NotNil(t, a.Rule)
	assert.Equal(t, a.Values, b.Values, "one counter per key for all of /api/")
	assert.True(t, c.Lookup("edge", es("path", "/healthz")).Rule.Unlimited)
}

// The layouts envoyproxy users deploy: RUNTIME_ROOT a link swapped to a new
// directory, and a Kubernetes config map whose files are links into a
// "..data" link that is swapped on update.
func TestWatcherFollowsLinks(t *testing.T) {
	base := t.TempDir()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	limit := func(n int) string {
		return fmt.Sprintf("domain: d\ndescriptors:\n  - key: x\n    rate_limit: {unit: second, requests_per_unit: %d}\n", n)
	}
	// Kubernetes: config/..v1/limits.yaml, config/..data -> ..v1,
	// config/limits.yaml -> ..data/limits.yaml.
	cm := filepath.Join(base, "cm")
	writeFile(t, filepath.Join(cm, "..v1", "limits.yaml"), limit(1), t0)
	require.NoError(t, os.Symlink("..v1", filepath.Join(cm, "..data")))
	require.NoError(t, os.Symlink(filepath.Join("..data", "limits.yaml"), filepath.Join(cm, "limits.yaml")))
	// RUNTIME_ROOT: current -> cm.
	require.NoError(t, os.Symlink(cm, filepath.Join(base, "current")))

	var applied []*Config
	w, err := NewWatcher(filepath.Join(base, "current"), ParseOptions{}, func(c *Config) error { applied = append(applied, c); return nil }, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"limits.yaml"}, w.Current().Files(), "..v1 and ..data are not read twice")
	assert.Equal(t, uint32(1), w.Current().Lookup("d", es("x", "1")).Rule.RequestsPerUnit)

	// The config map update: a new ..v2, ..data swapped.
	writeFile(t, filepath.Join(cm, "..v2", "limits.yaml"), limit(2), t0.Add(time.Second))
	require.NoError(t, os.Symlink("..v2", filepath.Join(cm, "..data.tmp")))
	require.NoError(t, os.Rename(filepath.Join(cm, "..data.tmp"), filepath.Join(cm, "..data")))
	require.True(t, w.Check())
	assert.Equal(t, uint32(2), w.Current().Lookup("d", es("x", "1")).Rule.RequestsPerUnit)

	// RUNTIME_ROOT swapped to another directory.
	other := filepath.Join(base, "other")
	writeFile(t, filepath.Join(other, "limits.yaml"), limit(3), t0)
	require.NoError(t, os.Symlink(other, filepath.Join(base, "current.tmp")))
	require.NoError(t, os.Rename(filepath.Join(base, "current.tmp"), filepath.Join(base, "current")))
	require.True(t, w.Check())
	assert.Equal(t, uint32(3), w.Current().Lookup("d", es("x", "1")).Rule.RequestsPerUnit)
	assert.Len(t, applied, 3)
}
