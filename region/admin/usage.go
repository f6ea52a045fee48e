package admin

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotientlabs/quotient/internal/rawcheck"
	"github.com/quotientlabs/quotient/limiter"
)

// RedisUsage reads key usage from every region's Redis with the limiter's
// own key layout: bucket and window state by a peek (cost 0: nothing is
// consumed or written), the share hash the coordinator writes, and the
// replicated window counts of global fixed windows (from the local region,
// whose hash holds every region's count). It is safe for concurrent use.
type RedisUsage struct {
	local   string
	regions []string
	lims    map[string]*limiter.Limiter
	stores  map[string]*limiter.RedisStore
	timeout time.Duration
}

// NewRedisUsage returns a reader over clients (region name to that
// region's Redis); local names this region and must be among them.
// nRegions is the number of regions sharing global policies (the default
// share is 1/nRegions). Every read of a region is bounded by timeout
// (default 500 ms when <= 0).
func NewRedisUsage(local string, clients map[string]redis.UniversalClient, nRegions int, timeout time.Duration) (*RedisUsage, error) {
	if _, ok := clients[local]; !ok {
		return nil, fmt.Errorf("admin: usage: no Redis client for the local region %q", local)
	}
	if timeout <= 0 {
		timeout = 500 * time.Millisecond
	}
	u := &RedisUsage{local: local, lims: map[string]*limiter.Limiter{}, stores: map[string]*limiter.RedisStore{}, timeout: timeout}
	for name, c := range clients {
		st := limiter.NewRedisStore(c)
		cfg := limiter.DefaultConfig()
		cfg.Store, cfg.Region, cfg.Regions = st, name, nRegions
		cfg.DenyCacheMaxKeys, cfg.EventSampleRate = -1, -1
		l, err := limiter.New(cfg, nil)
		if err != nil {
			return nil, fmt.Errorf("admin: usage: region %q: %w", name, err)
		}
		u.lims[name], u.stores[name] = l, st
		u.regions = append(u.regions, name)
	}
	sort.Strings(u.regions)
	return u, nil
}

// KeyUsage implements UsageReader.
func (u *RedisUsage) KeyUsage(ctx context.Context, subject limiter.Subject, policies []*limiter.Policy) ([]PolicyUsage, error) {
	out := make([]PolicyUsage, len(policies))
	for i, p := range policies {
		out[i] = PolicyUsage{Policy: p.ID, Regions: map[string]*RegionUsage{}}
	}
	reached := 0
	for _, name := range u.regions {
		ok := true
		for i, p := range policies {
			ru := u.read(ctx, name, subject, p)
			out[i].Regions[name] = ru
			ok = ok && ru.Reachable
		}
		if ok {
			reached++
		}
	}
	if reached == 0 && len(policies) > 0 {
		return nil, errors.New("admin: usage: no region's Redis answered")
	}
	for i, p := range policies {
		if p.Algorithm != limiter.FixedWindow || p.Scope != limiter.ScopeGlobal {
			continue
		}
		ctx, cancel := context.WithTimeout(ctx, u.timeout)
		wc, err := u.stores[u.local].WindowCounts(ctx, subject, p.ID)
		cancel()
		if err == nil && wc.StartMs > 0 {
			ws := time.UnixMilli(wc.StartMs).UTC()
			out[i].WindowStart, out[i].WindowCounts = &ws, wc.Counts
		}
	}
	return out, nil
}

func (u *RedisUsage) read(ctx context.Context, region string, subject limiter.Subject, p *limiter.Policy) *RegionUsage {
	ctx, cancel := context.WithTimeout(ctx, u.timeout)
	defer cancel()
	l := u.lims[region]
	d, err := rawcheck.CheckSubjectAt(l, ctx, l.Now(), subject, []*limiter.Policy{p}, 0)
	if err != nil || len(d.Policies) == 0 {
		msg := "no decision"
		if err != nil {
			msg = err.Error()
		}
		return &RegionUsage{Error: msg}
	}
	pd := d.Policies[0]
	ru := &RegionUsage{Reachable: true, Limit: pd.Limit, Remaining: pd.Remaining, ResetAfterMs: pd.ResetAfter.Milliseconds()}
	if p.Scope == limiter.ScopeGlobal && (p.Algorithm == limiter.TokenBucket || p.Algorithm == limiter.LeakyBucket) {
		h, err := u.stores[region].Client().HGetAll(ctx, limiter.ShareKey(subject, p.ID)).Result()
		if err == nil && h["r"] != "" {
			r, _ := strconv.ParseInt(h["r"], 10, 64)
			b, _ := strconv.ParseInt(h["b"], 10, 64)
			ru.Share = &Share{RatePerSec: float64(r) / 1000, Burst: float64(b) / 1000}
		}
	}
	return ru
}
