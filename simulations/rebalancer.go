package simulations

import (
	"fmt"
	"slices"
	"time"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/rebalancer/kafkabus"
	"github.com/quotientlabs/quotient/shares"
)

// RebalancerCoordinator drives the production rebalancer.Core exactly as
// a coordinator's driver does (see the rebalancer package doc), with the
// binaries' timing: CollectDelay after each epoch boundary (a wake-up)
// Collect the epoch's usage (write a late decision's updates and the
// shares given up at collection, then publish the report); Receive every
// report the bus delivers; Decide as soon as Due, that is when the view is
// complete or, at the latest, at the Core's Deadline (a wake-up), and again
// when a report completes a held view within the next epoch. Updates
// become share records in the region's store: a Delete installs the
// default share (what a missing record means), an ExpireAt becomes the
// record's TTL.
//
// The usage collected is every request of the epoch: the gateways flush
// every GatewayFlushInterval, which is not longer than the collect delay,
// so their last flush of the epoch has landed when the coordinator
// collects (NewRebalancerCoordinator refuses a delay shorter than the
// flush interval, which this model does not represent).
//
// Share writes fail while the region's store is down (RegionInfo.StoreDown),
// and are then handled as the driver does: kept (a newer update of a key
// replacing the older), retried every RetryInterval (the driver's default,
// min(1 s, epoch/10)), and while any is unwritten no report is published
// (the driver drops the report of that epoch: it would claim shares the
// store does not hold).
//
// After a crash (coordinator_down) the new instance re-reads the reports
// sent within the production coordinator's lookback
// (ReplayWindow) and, with a new Core, warms up: a restarted coordinator
// whose outage spanned more epochs than its fence lets it take over warm
// (longer than an epoch) starts cold in production too. A coordinator
// whose region published no report in the span a restart needs
// (rebalancer.FirstStartEpochs: the fleet's first start, or an outage
// longer than that) skips the warm-up (firstStart), as production's
// driver does with the bus's history.
type RebalancerCoordinator struct {
	core *rebalancer.Core
	info RegionInfo
	// Share updates not yet written (the store was down), by key, and
	// when to try again.
	unwritten []rebalancer.Update
	retryAt   time.Time
	retry     time.Duration
	lookback  time.Duration
	// defaults are the shares a deleted record stands for, by policy.
	defaults map[string]shares.Share
	delay    time.Duration
	// The epoch that ended at the last boundary, waiting for its
	// collection at collectAt.
	stashed   bool
	collectAt time.Time
	usage     []rebalancer.Usage
	// Asks and gives (transfer.go).
	fl           flushState
	droppedGives int64
	collected    bool // the Core collected an epoch (see firstStart)
}

// GatewayFlushInterval is how often the gateways flush their usage counts
// to their region's Redis: the default of limiter.UsageFlusherConfig's
// Interval, which quotient gateway uses (the limiter does not export it;
// TestGatewayFlushIntervalIsTheLimiters checks the two agree).
const GatewayFlushInterval = time.Second

// NewRebalancerCoordinator returns a NewCoordinator that builds a
// RebalancerCoordinator per region from cfg (Region, Regions and Epoch are
// set from the scenario, and ShrinkAtCollect is on; zero fields get the
// rebalancer's defaults), collecting each epoch after the binaries'
// default collect delay, rebalancer.DefaultCollectDelay(MaxWait).
func NewRebalancerCoordinator(cfg rebalancer.Config) NewCoordinator {
	return NewRebalancerCoordinatorDelay(cfg, -1)
}

// NewRebalancerCoordinatorDelay is NewRebalancerCoordinator with the
// collect delay given (0: collect at the boundary, the simulator's timing
// before it modelled production's; negative: the default). A delay must
// be below MaxWait, as for the driver, and at least GatewayFlushInterval
// unless 0.
func NewRebalancerCoordinatorDelay(cfg rebalancer.Config, delay time.Duration) NewCoordinator {
	return func(info RegionInfo) (Coordinator, error) {
		c := cfg
		// This adapter writes Published.Updates before it publishes.
		c.ShrinkAtCollect = true
		c.Region = info.Regions[info.Self]
		c.Regions = info.Regions
		c.Epoch = info.Epoch
		if c.MaxWait > c.Epoch/2 {
			c.MaxWait = 0 // the default, capped at half an epoch
		}
		limits := rebalancer.PolicyMap{}
		defaults := map[string]shares.Share{}
		for _, p := range info.Policies {
			if p.Algorithm == limiter.FixedWindow {
				continue // replicated counters (issue 6), not shares
			}
			lim := shares.Limit{RateMilli: p.RateMilli(), BurstMilli: p.BurstMilli(), Regions: len(info.Regions), MinCostMilli: p.MinCost() * 1000}
			if err := lim.Validate(); err != nil {
				// What the coordinator refuses at start (region.New).
				return nil, fmt.Errorf("rebalancer coordinator: global policy %q: %w", p.ID, err)
			}
			limits[p.ID] = lim
			defaults[p.ID] = lim.Default()
		}
		core, err := rebalancer.New(c, limits)
		if err != nil {
			return nil, err
		}
		mw := core.Config().MaxWait
		d := delay
		if d < 0 {
			d = rebalancer.DefaultCollectDelay(mw)
		}
		switch {
		case d >= mw:
			return nil, fmt.Errorf("rebalancer coordinator: collect delay %v not below MaxWait %v", d, mw)
		case d > 0 && d < GatewayFlushInterval:
			return nil, fmt.Errorf("rebalancer coordinator: collect delay %v is shorter than the gateways' flush interval %v, which the simulator does not model", d, GatewayFlushInterval)
		}
		cc := core.Config()
		return &RebalancerCoordinator{core: core, info: info, defaults: defaults, delay: d,
			retry:    min(time.Second, cc.Epoch/10),
			lookback: ReportLookback(cc)}, nil
	}
}

// ReportLookback is how far back a coordinator's report consumer starts
// (region.New: the bus's default lookback, at least SilenceEpochs+3
// epochs), so how far back a restarted one re-reads reports.
func ReportLookback(cfg rebalancer.Config) time.Duration {
	return max(kafkabus.DefaultConfig().Lookback, time.Duration(cfg.SilenceEpochs+3)*cfg.Epoch)
}

// ReplayWindow implements Replayer: the report consumer's lookback.
func (c *RebalancerCoordinator) ReplayWindow() time.Duration { return c.lookback }

// Core returns the driven Core (for statistics).
func (c *RebalancerCoordinator) Core() *rebalancer.Core { return c.core }

// Receive implements Coordinator.
func (c *RebalancerCoordinator) Receive(now time.Time, msg Message) TickResult {
	var res TickResult
	switch p := msg.Payload.(type) {
	case *rebalancer.Report:
		if _, err := c.core.ReceiveAt(now, p); err != nil {
			return TickResult{Err: err}
		}
	case *rebalancer.Ask:
		if err := c.receiveAsk(now, p, &res); err != nil {
			return TickResult{Err: err}
		}
	case *rebalancer.Give:
		if err := c.receiveGive(now, p, &res); err != nil {
			return TickResult{Err: err}
		}
	default:
		return TickResult{} // another coordinator's (see Combine)
	}
	c.step(now, &res)
	return res
}

// Tick implements Coordinator.
func (c *RebalancerCoordinator) Tick(now time.Time, boundary bool, usage []Usage) TickResult {
	var res TickResult
	if boundary {
		// A stash left from an earlier boundary was not collected (the
		// coordinator was down at its collection): its usage is lost.
		c.stashed, c.collectAt = true, now.Add(c.delay)
		c.usage = c.usage[:0]
		for _, u := range usage {
			if _, global := c.defaults[u.Policy]; !global {
				continue
			}
			c.usage = append(c.usage, rebalancer.Usage{
				Key:    rebalancer.Key{PolicyID: u.Policy, Subject: u.Subject.Key()},
				Demand: u.Demand, Admitted: u.Admitted,
			})
		}
		if c.core.Config().Transfers {
			c.flushAt(now, usage, true) // a boundary is a flush too
		}
	}
	c.step(now, &res)
	return res
}

// step does what is due at now, as the driver's loop does: the pending
// collection, then a decision; and asks for a wake-up at the next thing
// due.
func (c *RebalancerCoordinator) step(now time.Time, res *TickResult) {
	if len(c.unwritten) > 0 && !now.Before(c.retryAt) {
		if err := c.flush(now, res); err != nil {
			res.Err = err
			return
		}
	}
	if c.stashed && !now.Before(c.collectAt) {
		c.stashed = false
		if err := c.collect(now, res); err != nil {
			res.Err = err
			return
		}
	}
	if c.core.Due(now) {
		d, err := c.core.Decide(now)
		if err != nil {
			res.Err = err
			return
		}
		if err := c.updates(now, d.Updates, res); err != nil {
			res.Err = err
			return
		}
	}
	c.transfers(now, res)
	var wake time.Time
	if _, pending := c.core.Pending(); pending {
		wake = c.core.Deadline()
	}
	if c.stashed && (wake.IsZero() || c.collectAt.Before(wake)) {
		wake = c.collectAt
	}
	if len(c.unwritten) > 0 && (wake.IsZero() || c.retryAt.Before(wake)) {
		wake = c.retryAt
	}
	if t := c.transferWake(); !t.IsZero() && (wake.IsZero() || t.Before(wake)) {
		wake = t
	}
	res.Wake = wake
}

// collect collects the stashed epoch at now.
func (c *RebalancerCoordinator) collect(now time.Time, res *TickResult) error {
	if !c.collected {
		c.collected = true
		c.firstStart(now)
	}
	pub, err := c.core.Collect(now, c.usage)
	if err != nil {
		return err
	}
	if pub.Late != nil {
		if err := c.updates(now, pub.Late.Updates, res); err != nil {
			return err
		}
	}
	c.enqueue(pub.Updates)
	if pub.Report == nil {
		return nil
	}
	if len(c.unwritten) > 0 {
		if err := c.flush(now, res); err != nil {
			return err
		}
	}
	if len(c.unwritten) == 0 { // else the report is not published
		res.Publish = append(res.Publish, pub.Report)
	}
	return nil
}

// firstStart makes the Core skip its warm-up, before its first collection
// at now, when no report of this region was published in the span a
// restart needs, as the production driver decides from the bus
// (rebalancer.DriverConfig.History): at the fleet's first start, and after
// an outage longer than the span.
func (c *RebalancerCoordinator) firstStart(now time.Time) {
	if c.info.LastReport == nil {
		return
	}
	cc := c.core.Config()
	f := rebalancer.EpochOf(now, cc.Epoch) - 1
	since := rebalancer.EpochStart(f-rebalancer.FirstStartEpochs(cc), cc.Epoch).Add(-cc.Epoch)
	if last, ok := c.info.LastReport(); !ok || last.Before(since) {
		_ = c.core.StartFresh() // refused only after a Collect or Adopt: none yet
	}
}

// updates queues ups and writes what is queued (unless the store is down).
func (c *RebalancerCoordinator) updates(now time.Time, ups []rebalancer.Update, res *TickResult) error {
	c.enqueue(ups)
	return c.flush(now, res)
}

// enqueue adds ups to the unwritten updates, a newer update of a key
// replacing the older.
func (c *RebalancerCoordinator) enqueue(ups []rebalancer.Update) {
	if len(c.unwritten) == 0 { // the common case: one decision's updates, one per key
		c.unwritten = append(c.unwritten, ups...)
		return
	}
	for _, u := range ups {
		i := slices.IndexFunc(c.unwritten, func(o rebalancer.Update) bool { return o.Key == u.Key })
		if i >= 0 {
			c.unwritten[i] = u
		} else {
			c.unwritten = append(c.unwritten, u)
		}
	}
}

// flush writes the unwritten updates into res, or, while the store is
// down, keeps them and sets the retry time. An error is an internal one
// (an update for a subject the scenario does not have).
func (c *RebalancerCoordinator) flush(now time.Time, res *TickResult) error {
	if len(c.unwritten) == 0 {
		return nil
	}
	if c.info.StoreDown != nil && c.info.StoreDown(now) {
		c.retryAt = now.Add(c.retry)
		return nil
	}
	ups := c.unwritten
	c.unwritten = nil
	for _, u := range ups {
		subj, ok := c.info.Subject(u.Subject)
		if !ok {
			return fmt.Errorf("rebalancer coordinator: update for unknown subject %q", u.Subject)
		}
		su := ShareUpdate{Policy: u.PolicyID, Subject: subj}
		if u.Delete {
			def := c.defaults[u.PolicyID]
			su.RateMilli, su.BurstMilli = def.RateMilli, def.BurstMilli
		} else {
			su.RateMilli, su.BurstMilli = u.Share.RateMilli, u.Share.BurstMilli
			su.TTL = max(time.Millisecond, u.ExpireAt.Sub(now))
		}
		res.Shares = append(res.Shares, su)
	}
	return nil
}
