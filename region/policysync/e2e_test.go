package policysync_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/quotientlabs/quotient/internal/kafkautil"
	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/region/admin"
	"github.com/quotientlabs/quotient/region/policysync"
)

// EnforceBound is the bound: a change made in one region is
// enforced in every region within it.
const EnforceBound = 60 * time.Second

const adminTok = "admin-token-0123456789"

// region is one region on loopback: its Redis, a coordinator (Catalog,
// Follower, Materializer, admin API) and one gateway (limiter + Reloader).
type region struct {
	name     string
	cat      *admin.Catalog
	follower *policysync.Follower
	lim      *limiter.Limiter
	reloader *policysync.Reloader
	api      *httptest.Server
}

func startRegion(t *testing.T, ctx context.Context, name string, cl *kafkautil.Cluster, log admin.Log) *region {
	t.Helper()
	rs := redistest.StartServer(t)
	r := &region{name: name, cat: admin.NewCatalog()}
	mat := policysync.NewMaterializer(r.cat, rs.Client(), nil)
	r.follower = policysync.NewFollower(cl, policysync.Topic, r.cat, mat.Notify, slog.New(slog.DiscardHandler))
	cfg := limiter.DefaultConfig()
	cfg.Store, cfg.Region, cfg.Regions, cfg.Deadline = limiter.NewRedisStore(rs.Client()), name, 2, time.Second
	var err error
	r.lim, err = limiter.New(cfg, nil)
	require.NoError(t, err)
	r.reloader, err = policysync.NewReloader(policysync.ReloaderConfig{Client: rs.Client(), Target: r.lim})
	require.NoError(t, err)
	toks, err := admin.ParseTokens([]byte("ops-" + name + " admin " + adminTok + "\n"))
	require.NoError(t, err)
	srv, err := admin.NewServer(admin.Config{Catalog: r.cat, Log: log, Tokens: toks})
	require.NoError(t, err)
	r.api = httptest.NewServer(srv)
	t.Cleanup(r.api.Close)
	for _, run := range []func(context.Context) error{r.follower.Run, mat.Run, r.reloader.Run} {
		go func() { _ = run(ctx) }()
	}
	return r
}

func (r *region) call(t *testing.T, method, path, body string) int {
	t.Helper()
	req, err := http.NewRequest(method, r.api.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+adminTok)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	return res.StatusCode
}

// check decides one request of API key k1 (tier pro) at the gateway.
func (r *region) check(t *testing.T) limiter.Decision {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := r.lim.Check(ctx, limiter.Request{Identity: limiter.Identity{APIKey: "k1", Tier: "pro"}, Method: "GET", Path: "/v1/x"})
	require.NoError(t, err)
	return d
}

// waitUntil polls cond every 10 ms until it holds or bound passes, and
// returns the time it took.
func waitUntil(t *testing.T, bound time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > bound {
			t.Fatalf("%s: not within %v", what, bound)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

func versionInForce(l *limiter.Limiter, id string) (int64, limiter.Mode) {
	for _, p := range l.Policies() {
		if p.ID == id {
			return p.Version, p.Mode
		}
	}
	return 0, ""
}

// TestPolicyLifecycleTwoRegions: a policy written in region eu starts in
// shadow in both regions (requests over it are would-reject, still
// admitted), is switched to enforce and rejects in both regions within the
// bound, and a rollback returns both to shadow. Two redis-servers, one kfake
// broker, the real admin API, Kafka log, materialisation and gateway reload.
func TestPolicyLifecycleTwoRegions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	t.Cleanup(kc.Close)
	cl, err := kafkautil.New(kafkautil.DefaultConfig(kc.ListenAddrs()...))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Close() })
	require.NoError(t, cl.EnsureTopics(ctx, policysync.TopicSpec(1)))
	klog, err := policysync.NewKafkaLog(cl, policysync.Topic)
	require.NoError(t, err)
	t.Cleanup(func() { _ = klog.Close() })

	eu := startRegion(t, ctx, "eu", cl, klog)
	us := startRegion(t, ctx, "us", cl, klog)
	both := []*region{eu, us}
	waitUntil(t, 30*time.Second, "followers ready", func() bool { return eu.follower.Ready() && us.follower.Ready() })

	// 1. Shadow.
	put := `{"expected_version":%d,"enforce":%t,"policy":{"algorithm":"token_bucket","rate_per_sec":0.01,"burst":3,"match":{"tier":"pro"}}}`
	require.Equal(t, http.StatusCreated, eu.call(t, "PUT", "/v1/policies/pro-burst", sprintf(put, 0, false)))
	for _, r := range both {
		took := waitUntil(t, EnforceBound, r.name+" has version 1", func() bool { v, _ := versionInForce(r.lim, "pro-burst"); return v == 1 })
		t.Logf("%s: shadow version in force %v after the write", r.name, took.Round(time.Millisecond))
		_, mode := versionInForce(r.lim, "pro-burst")
		assert.Equal(t, limiter.Shadow, mode)
		wouldReject := 0
		for range 5 {
			d := r.check(t)
			require.True(t, d.Allowed, "shadow never rejects")
			require.Len(t, d.Policies, 1)
			if !d.Policies[0].Allowed {
				wouldReject++
			}
		}
		assert.Equal(t, 2, wouldReject, "%s: 5 requests against a burst of 3 are 2 would-rejects", r.name)
	}

	// 2. Enforce, measured from the write to the first rejection in each
	// region.
	start := time.Now()
	require.Equal(t, http.StatusOK, eu.call(t, "PUT", "/v1/policies/pro-burst", sprintf(put, 1, true)))
	for _, r := range both {
		waitUntil(t, EnforceBound-time.Since(start), r.name+" enforces", func() bool { return !r.check(t).Allowed })
		took := time.Since(start)
		t.Logf("%s: enforced %v after the write in eu (bound %v)", r.name, took.Round(time.Millisecond), EnforceBound)
		assert.Less(t, took, EnforceBound)
	}

	// 3. Roll back to version 1 from the other region: shadow again.
	start = time.Now()
	require.Equal(t, http.StatusOK, us.call(t, "POST", "/v1/policies/pro-burst/rollback", `{"to_version":1,"expected_version":2}`))
	for _, r := range both {
		waitUntil(t, EnforceBound-time.Since(start), r.name+" rolled back", func() bool { v, _ := versionInForce(r.lim, "pro-burst"); return v == 3 })
		_, mode := versionInForce(r.lim, "pro-burst")
		assert.Equal(t, limiter.Shadow, mode)
		assert.True(t, r.check(t).Allowed, "%s admits again after the rollback", r.name)
		t.Logf("%s: rollback in force %v after the write in us", r.name, time.Since(start).Round(time.Millisecond))
	}

	// Both catalogs (and audit logs) agree; the gateways report the
	// generation.
	for _, r := range both {
		h := r.cat.History(admin.KindPolicy, "pro-burst")
		require.Len(t, h, 3)
		assert.Equal(t, "ops-us", h[0].Author)
		assert.Equal(t, eu.cat.Generation(), r.reloader.Generation())
		assert.Len(t, r.cat.Audit(admin.AuditFilter{}), 3)
	}

	// 4. An override reaches the gateways, and lapses at its expiry.
	exp := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	require.Equal(t, http.StatusCreated, eu.call(t, "POST", "/v1/overrides", sprintf(`{"subject":"k:k1","policy":"pro-burst","burst":50,"expires_at":%q}`, exp.Format(time.RFC3339))))
	subj := limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "k1"}
	for _, r := range both {
		waitUntil(t, EnforceBound, r.name+" has the override", func() bool { _, ok := r.reloader.Override(subj, "pro-burst", time.Now()); return ok })
		p, _ := r.reloader.Override(subj, "pro-burst", time.Now())
		assert.Equal(t, 50.0, p.Burst)
		_, ok := r.reloader.Override(subj, "pro-burst", exp)
		assert.False(t, ok, "an override is not in force at its expiry")
	}
}
