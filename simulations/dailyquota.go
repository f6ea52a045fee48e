package simulations

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/quotientlabs/quotient/dailyquota"
	"github.com/quotientlabs/quotient/limiter"
)

// DailyQuotaCoordinator drives the production dailyquota.Driver (the
// coordinator's daily-quota replication, issue 6) in virtual time, the way
// region/dailyquota.go runs it over Redis and Kafka, with no goroutine:
// every Driver.Interval of the region's clock (a wake-up, or the epoch
// boundary) it calls Driver.Pass, and for every count the bus delivers
// Driver.Deliver. The Driver's interfaces are adapted to the engine:
//
//   - Store: Read is RegionInfo.WindowCounts (the region's MemoryStore at
//     now); Merge and SetCaps become TickResult.Windows and TickResult.Caps,
//     which the engine applies with MemoryStore.MergeWindowCount and
//     SetWindowCap at the same instant.
//   - ActiveKeys: the keys the region's gateways admitted on, from the
//     engine's own records (RegionInfo.Served, plus the epoch's usage at a
//     boundary): what the gateways' usage counts give the production driver,
//     without their one-second flush delay.
//   - Bus: Publish puts the counts on the engine's bus as one payload
//     (latency, jitter, loss, duplication and partitions apply) and always
//     succeeds; the counts the bus then drops are lost to their receiver
//     until the count grows or its refresh (PublisherConfig.Refresh) is
//     due. Kafka would keep them; see NewDailyQuotaCoordinator.
//
// Everything that decides — what to publish (Publisher), what a receiver
// merges (Accept), the remainder-split caps (Caps) and when they are
// recomputed — is the production code's. Not safe for concurrent use (the
// engine calls it from one goroutine).
type DailyQuotaCoordinator struct {
	info     RegionInfo
	driver   *dailyquota.Driver
	now      time.Time   // the Driver's clock
	res      *TickResult // the result of the call in progress
	usage    []Usage     // the boundary's usage during a boundary Tick
	interval time.Duration
}

// dailyQuotaCounts is the bus payload of a DailyQuotaCoordinator: one
// Publish call's counts. Receivers only read it.
type dailyQuotaCounts []dailyquota.Count

// WindowPolicies returns the replicated window policies among ps (global
// fixed windows, window_s seconds aligned to the Unix epoch), as
// dailyquota/redisio.Policies does for the coordinator.
func WindowPolicies(ps []*limiter.Policy) []dailyquota.Policy {
	var out []dailyquota.Policy
	for _, p := range ps {
		if p.Algorithm == limiter.FixedWindow && p.Scope == limiter.ScopeGlobal {
			out = append(out, dailyquota.Policy{ID: p.ID, Limit: p.Limit, Window: dailyquota.Fixed(time.Duration(p.WindowMs()) * time.Millisecond)})
		}
	}
	return out
}

// NewDailyQuotaCoordinator returns a NewCoordinator that builds a
// DailyQuotaCoordinator per region from cfg, a dailyquota.DriverConfig
// whose Region, Regions, Policies, Clock and Logger are set from the
// scenario and the engine (zero fields get the production defaults:
// publish every second, remainder split below 20% of the limit unless
// NoSplit, refresh every hour). A scenario without global fixed windows
// gets a StaticCoordinator: there is nothing to replicate.
//
// The bus of the engine drops what a partition or loss catches, where
// Kafka would deliver it late; a shorter cfg.Publisher.Refresh re-sends
// unchanged counts sooner and so models that durability.
func NewDailyQuotaCoordinator(cfg dailyquota.DriverConfig) NewCoordinator {
	return func(info RegionInfo) (Coordinator, error) {
		pols := WindowPolicies(info.Policies)
		if len(pols) == 0 {
			return StaticCoordinator{}, nil
		}
		if info.Served == nil || info.WindowCounts == nil || info.Subject == nil {
			return nil, errors.New("daily-quota coordinator: RegionInfo lacks Served, WindowCounts or Subject")
		}
		c := &DailyQuotaCoordinator{info: info}
		dcfg := cfg
		dcfg.Region, dcfg.Regions, dcfg.Policies = info.Regions[info.Self], info.Regions, pols
		dcfg.Clock, dcfg.Logger = dqClock{c}, nil
		d, err := dailyquota.NewDriver(dcfg, dqStore{c}, dqActive{c}, dqBus{c})
		if err != nil {
			return nil, err
		}
		c.driver = d
		c.interval = cfg.Interval
		if c.interval <= 0 {
			c.interval = dailyquota.DefaultDriverConfig("", nil, nil).Interval
		}
		return c, nil
	}
}

// ReplayWindow implements Replayer: a restarted coordinator reads the
// daily-quota topic, a compacted one, from its start.
func (c *DailyQuotaCoordinator) ReplayWindow() time.Duration { return math.MaxInt64 }

// Driver returns the driven Driver (for its Stats).
func (c *DailyQuotaCoordinator) Driver() *dailyquota.Driver { return c.driver }

// Receive implements Coordinator: every count of a daily-quota payload
// goes through Driver.Deliver (Accept, then a merge). Other payloads are
// another coordinator's (see Combine).
func (c *DailyQuotaCoordinator) Receive(now time.Time, msg Message) TickResult {
	counts, ok := msg.Payload.(dailyQuotaCounts)
	if !ok {
		return TickResult{}
	}
	var res TickResult
	c.now, c.res = now, &res
	defer func() { c.res = nil }()
	for _, cnt := range counts {
		c.driver.Deliver(cnt)
	}
	return res
}

// Tick implements Coordinator: one Driver.Pass, and a wake-up at the next
// multiple of the interval.
func (c *DailyQuotaCoordinator) Tick(now time.Time, boundary bool, usage []Usage) TickResult {
	res := TickResult{Wake: now.Truncate(c.interval).Add(c.interval)}
	c.now, c.res = now, &res
	if boundary {
		c.usage = usage
	}
	defer func() { c.res, c.usage = nil, nil }()
	if err := c.driver.Pass(context.Background()); err != nil {
		return TickResult{Err: err}
	}
	return res
}

func (c *DailyQuotaCoordinator) subject(encoded string) (limiter.Subject, error) {
	s, ok := c.info.Subject(encoded)
	if !ok {
		return limiter.Subject{}, fmt.Errorf("daily-quota coordinator: unknown subject %q", encoded)
	}
	return s, nil
}

// dqClock is the Driver's clock: the time of the call in progress. Run is
// never called, so timers are never asked for.
type dqClock struct{ c *DailyQuotaCoordinator }

func (k dqClock) Now() time.Time { return k.c.now }

func (dqClock) NewTimer(time.Duration) (<-chan time.Time, func() bool) {
	panic("simulations: the daily-quota driver's Run is not used in virtual time")
}

// dqStore is the Driver's Store over the region's MemoryStore.
type dqStore struct{ c *DailyQuotaCoordinator }

func (s dqStore) Read(_ context.Context, keys []dailyquota.PolicySubject) ([]dailyquota.Stored, error) {
	out := make([]dailyquota.Stored, len(keys))
	for i, k := range keys {
		subj, err := s.c.subject(k.Subject)
		if err != nil {
			return nil, err
		}
		wc := s.c.info.WindowCounts(s.c.now, subj, k.Policy)
		out[i] = dailyquota.Stored{StartMs: wc.StartMs, Counts: wc.Counts, Cap: wc.Cap}
	}
	return out, nil
}

func (s dqStore) Merge(_ context.Context, counts []dailyquota.Count) ([]dailyquota.Count, error) {
	var failed []dailyquota.Count
	var errs []error
	for _, cnt := range counts {
		subj, err := s.c.subject(cnt.Subject)
		if err != nil {
			failed, errs = append(failed, cnt), append(errs, err)
			continue
		}
		s.c.res.Windows = append(s.c.res.Windows, WindowCount{Policy: cnt.Policy, Subject: subj,
			WindowStartMs: cnt.StartMs, WindowMs: cnt.WindowMs, Region: cnt.Region, Count: cnt.N})
	}
	return failed, errors.Join(errs...)
}

func (s dqStore) SetCaps(_ context.Context, caps []dailyquota.CapUpdate) ([]dailyquota.CapUpdate, error) {
	var failed []dailyquota.CapUpdate
	var errs []error
	for _, u := range caps {
		subj, err := s.c.subject(u.Subject)
		if err != nil {
			failed, errs = append(failed, u), append(errs, err)
			continue
		}
		s.c.res.Caps = append(s.c.res.Caps, WindowCap{Policy: u.Policy, Subject: subj,
			WindowStartMs: u.StartMs, WindowMs: u.WindowMs, Cap: u.Cap})
	}
	return failed, errors.Join(errs...)
}

// dqActive is the Driver's ActiveKeys: the keys with admitted cost in the
// engine's records of this region's gateways, this epoch so far and, at a
// boundary, the epoch that just ended.
type dqActive struct{ c *DailyQuotaCoordinator }

func (a dqActive) Active(context.Context, time.Time) ([]dailyquota.PolicySubject, error) {
	var out []dailyquota.PolicySubject
	for _, us := range [][]Usage{a.c.usage, a.c.info.Served()} {
		for _, u := range us {
			if u.Admitted > 0 {
				out = append(out, dailyquota.PolicySubject{Policy: u.Policy, Subject: u.Subject.Key()})
			}
		}
	}
	return out, nil
}

// dqBus is the Driver's Bus: the engine's bus.
type dqBus struct{ c *DailyQuotaCoordinator }

func (b dqBus) Publish(_ context.Context, counts []dailyquota.Count) error {
	b.c.res.Publish = append(b.c.res.Publish, dailyQuotaCounts(slices.Clone(counts)))
	return nil
}

func (dqBus) Run(context.Context, func(dailyquota.Count)) error {
	return errors.New("simulations: the engine delivers daily-quota counts through Receive")
}

// served returns what region r's gateways counted since its last epoch
// boundary, one entry per policy and subject with demand, sorted: the
// engine's own records, for RegionInfo.Served.
func (e *engine) served(r int) []Usage {
	rs := e.regions[r]
	ks := slices.Clone(rs.touched)
	slices.Sort(ks)
	out := make([]Usage, 0, len(ks))
	for _, k := range ks {
		out = append(out, Usage{Policy: e.rec.keys[k].policy.ID, Subject: e.subjects[k], Demand: rs.usageDemand[k], Admitted: rs.usageAdmit[k]})
	}
	return out
}
