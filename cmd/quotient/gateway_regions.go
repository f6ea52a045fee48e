package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/region"
)

// The region set of a gateway (which regions share its global policies,
// and which one it is) decides the default share of every key without a
// share record: 1/n of the global limit. A gateway that believes it is
// alone enforces n x L across n regions, so the set is stated once, by the
// coordinator, in the region's Redis (limiter.RegionSetKey), and the
// gateway's --region/--regions flags are checked against it:
//
//   - at start, the coordinator's record wins over the flags when both
//     exist (the coordinator computes the shares and reads the usage with
//     its set); a disagreement is logged as an error and set in the
//     quotient_gateway_region_set_mismatch gauge;
//   - without the record (no coordinator yet, or Redis down) the flags
//     decide; without either, a gateway whose policies include a global
//     one refuses to start, naming --regions, and a policy set with a
//     global policy that arrives later is refused (the last set stays);
//   - the record is read again every regionSetInterval: a change takes
//     effect at once (limiter.SetRegions).
//
// The usage epoch and shard count cannot change under a running flusher:
// the record's values are taken at start, and a later change is only
// reported (log and gauge).

// regionSetInterval is how often a gateway reads the coordinator's region
// set again.
const regionSetInterval = 10 * time.Second

// regionSetReadTimeout bounds one read of the coordinator's region set.
const regionSetReadTimeout = 2 * time.Second

// gatewayRegions tracks the region set of a serving process (quotient
// gateway, quotient rls: the same rules for both). Safe for concurrent
// use.
type gatewayRegions struct {
	flags    *limiter.RegionSet // from --region/--regions; nil when not given
	client   redis.UniversalClient
	log      *slog.Logger
	mismatch prometheus.Gauge
	name     string // the subcommand, in messages; "" = gateway

	mu    sync.Mutex
	known bool              // a region set is in force
	cur   limiter.RegionSet // the set in force, when known
	lim   *limiter.Limiter  // set by attach
}

// flagRegionSet is the region set the flags give, nil when --regions is
// empty.
func flagRegionSet(cfg *limiterFlags) (*limiter.RegionSet, error) {
	if cfg.regions == "" {
		return nil, nil
	}
	regions, err := limiter.ParseRegionList(cfg.regions)
	if err != nil {
		return nil, fmt.Errorf("--regions: %w", err)
	}
	if cfg.region == "" {
		return nil, errors.New("--region is required with --regions (or QUOTIENT_REGION): this gateway's region, one of --regions")
	}
	if !slices.Contains(regions, cfg.region) {
		return nil, fmt.Errorf("--region %q is not one of --regions %s", cfg.region, strings.Join(regions, ","))
	}
	return &limiter.RegionSet{Region: cfg.region, Regions: regions, Epoch: cfg.epoch, UsageShards: cfg.usageShards}, nil
}

// resolve decides the region set at start from the flags and the
// coordinator's record, and adjusts cfg's epoch and usage shards to the
// record. It fails when a global policy is among policies and no set is
// known.
func (g *gatewayRegions) resolve(ctx context.Context, cfg *limiterFlags, policies []*limiter.Policy) error {
	rec, ok := g.read(ctx)
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case ok:
		g.known, g.cur = true, rec
		if g.flags != nil {
			g.compare(rec)
		}
		cfg.epoch, cfg.usageShards, cfg.usageSplit = rec.Epoch, rec.UsageShards, rec.SplitShards
	case g.flags != nil:
		g.known, g.cur = true, *g.flags
	}
	if g.known {
		if err := checkGlobalBursts(policies, len(g.cur.Regions)); err != nil {
			return fmt.Errorf("--policies: %w", err)
		}
		g.log.Info("region set", "region", g.cur.Region, "regions", strings.Join(g.cur.Regions, ","), "source", map[bool]string{true: "coordinator", false: "flags"}[ok])
		return nil
	}
	if id := firstGlobal(policies); id != "" {
		return fmt.Errorf("--regions is required (or QUOTIENT_REGIONS): policy %q is scope global, and without the region list every region would enforce its whole limit; pass the coordinators' --regions and this gateway's --region, or start the region's coordinator first (it writes the list to %s)", id, limiter.RegionSetKey)
	}
	return nil
}

// region is the region name in force for metric labels and logs.
func (g *gatewayRegions) region(fallback string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.known {
		return g.cur.Region
	}
	return fallback
}

// attach makes l enforce the set in force (when known) and future changes.
func (g *gatewayRegions) attach(l *limiter.Limiter) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lim = l
	if !g.known {
		return nil
	}
	return l.SetRegions(g.cur.Region, len(g.cur.Regions))
}

// read reads the coordinator's record, logging a failure (false then).
func (g *gatewayRegions) read(ctx context.Context) (limiter.RegionSet, bool) {
	rctx, cancel := context.WithTimeout(ctx, regionSetReadTimeout)
	defer cancel()
	rec, ok, err := limiter.ReadRegionSet(rctx, g.client)
	if err != nil {
		g.log.Warn("cannot read the coordinator's region set; keeping the one in force", "key", limiter.RegionSetKey, "err", err)
		return limiter.RegionSet{}, false
	}
	return rec, ok
}

// compare reports whether the flags disagree with the record. g.mu held.
func (g *gatewayRegions) compare(rec limiter.RegionSet) {
	diff := g.flags.Differences(rec)
	if len(diff) == 0 {
		g.mismatch.Set(0)
		return
	}
	g.mismatch.Set(1)
	g.log.Error("the "+g.who()+"'s --region/--regions/--epoch/--usage-shards disagree with the region's coordinator; enforcing the coordinator's region set", "differences", strings.Join(diff, "; "))
}

// refresh reads the record again and applies a change.
func (g *gatewayRegions) refresh(ctx context.Context) {
	rec, ok := g.read(ctx)
	if !ok {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.flags != nil {
		g.compare(rec)
	}
	if g.known && len(g.cur.Differences(rec)) == 0 {
		return
	}
	if g.known && (rec.Epoch != g.cur.Epoch || rec.UsageShards != g.cur.UsageShards || (rec.UsageShards == 0 && rec.SplitShards != g.cur.SplitShards)) {
		g.mismatch.Set(1)
		g.log.Error("the coordinator's usage epoch or shard count changed; restart the "+g.who()+" to follow it (usage written meanwhile may not be read)", "epoch", rec.Epoch, "usage_shards", rec.UsageShards, "gateway_epoch", g.cur.Epoch, "gateway_usage_shards", g.cur.UsageShards)
		rec.Epoch, rec.UsageShards, rec.SplitShards = g.cur.Epoch, g.cur.UsageShards, g.cur.SplitShards
	}
	if g.lim != nil {
		if err := g.lim.SetRegions(rec.Region, len(rec.Regions)); err != nil {
			g.log.Error("cannot apply the coordinator's region set", "err", err)
			return
		}
	}
	g.known, g.cur = true, rec
	g.log.Info("region set changed", "region", rec.Region, "regions", strings.Join(rec.Regions, ","))
}

// run refreshes every interval until ctx ends.
func (g *gatewayRegions) run(ctx context.Context, every time.Duration) {
	tickEvery(ctx, every, func() { g.refresh(ctx) })
}

// guard is target (the limiter, or what sets its policies) as a policy
// setter that refuses a set with a global policy while no region set is
// known.
func (g *gatewayRegions) guard(target policySetter) policySetter {
	return guardedSetter{g: g, l: target}
}

// policySetter takes a new policy set, or refuses it with an error (the
// last set stays in force). *limiter.Limiter and *rls.Server are ones.
type policySetter interface {
	SetPolicies([]*limiter.Policy) error
}

type guardedSetter struct {
	g *gatewayRegions
	l policySetter
}

// who names the process in messages.
func (g *gatewayRegions) who() string {
	if g.name == "" {
		return "gateway"
	}
	return g.name
}

func (s guardedSetter) SetPolicies(ps []*limiter.Policy) error {
	s.g.mu.Lock()
	known, n := s.g.known, len(s.g.cur.Regions)
	s.g.mu.Unlock()
	if id := firstGlobal(ps); id != "" && !known {
		return fmt.Errorf("policy %q is scope global but the %s knows no region set: pass --regions and --region, or start the region's coordinator", id, s.g.who())
	}
	if known {
		if err := checkGlobalBursts(ps, n); err != nil {
			return err
		}
	}
	return s.l.SetPolicies(ps)
}

// checkGlobalBursts refuses a global bucket policy whose burst cannot give
// each of n regions one request of its cheapest cost (the coordinator
// refuses it too: some region would admit nothing), naming the policy.
func checkGlobalBursts(ps []*limiter.Policy, n int) error {
	limits, _ := region.GlobalLimits(ps, n)
	ids := slices.Sorted(maps.Keys(limits))
	for _, id := range ids {
		if err := limits[id].Validate(); err != nil {
			return fmt.Errorf("global policy %q over %d regions: %w", id, n, err)
		}
	}
	return nil
}

// firstGlobal is the id of the first global policy of ps, "" if none.
func firstGlobal(ps []*limiter.Policy) string {
	for _, p := range ps {
		if p.Scope == limiter.ScopeGlobal {
			return p.ID
		}
	}
	return ""
}
