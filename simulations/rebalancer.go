package simulations

import (
	"fmt"
	"time"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/shares"
)

// RebalancerCoordinator drives the production rebalancer.Core exactly as
// a coordinator's driver does (see the rebalancer package doc): at each
// epoch boundary Collect (write a late decision's updates and the shares
// given up at collection, then publish the report); Receive every report
// the bus delivers; Decide as soon as Due, that is when the view is
// complete or, at the latest, at the Core's
// Deadline (a wake-up). Updates become share records in the region's store:
// a Delete installs the default share (what a missing record means), an
// ExpireAt becomes the record's TTL.
type RebalancerCoordinator struct {
	core *rebalancer.Core
	info RegionInfo
	// defaults are the shares a deleted record stands for, by policy.
	defaults map[string]shares.Share
	usage    []rebalancer.Usage // scratch
}

// NewRebalancerCoordinator returns a NewCoordinator that builds a
// RebalancerCoordinator per region from cfg (Region, Regions and Epoch are
// set from the scenario, and ShrinkAtCollect is on; zero fields get the
// rebalancer's defaults).
func NewRebalancerCoordinator(cfg rebalancer.Config) NewCoordinator {
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
			lim := shares.Limit{RateMilli: p.RateMilli(), BurstMilli: p.BurstMilli(), Regions: len(info.Regions)}
			limits[p.ID] = lim
			defaults[p.ID] = lim.Default()
		}
		core, err := rebalancer.New(c, limits)
		if err != nil {
			return nil, err
		}
		return &RebalancerCoordinator{core: core, info: info, defaults: defaults}, nil
	}
}

// Core returns the driven Core (for statistics).
func (c *RebalancerCoordinator) Core() *rebalancer.Core { return c.core }

// Receive implements Coordinator.
func (c *RebalancerCoordinator) Receive(now time.Time, msg Message) TickResult {
	rep, ok := msg.Payload.(*rebalancer.Report)
	if !ok {
		return TickResult{} // another coordinator's (see Combine)
	}
	if _, err := c.core.ReceiveAt(now, rep); err != nil {
		return TickResult{Err: err}
	}
	var res TickResult
	c.decideIfDue(now, &res)
	return res
}

// Tick implements Coordinator.
func (c *RebalancerCoordinator) Tick(now time.Time, boundary bool, usage []Usage) TickResult {
	var res TickResult
	if boundary {
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
		pub, err := c.core.Collect(now, c.usage)
		if err != nil {
			return TickResult{Err: err}
		}
		if pub.Late != nil {
			if err := c.updates(now, pub.Late.Updates, &res); err != nil {
				return TickResult{Err: err}
			}
		}
		if err := c.updates(now, pub.Updates, &res); err != nil {
			return TickResult{Err: err}
		}
		if pub.Report != nil {
			res.Publish = append(res.Publish, pub.Report)
		}
	}
	c.decideIfDue(now, &res)
	return res
}

func (c *RebalancerCoordinator) decideIfDue(now time.Time, res *TickResult) {
	if !c.core.Due(now) {
		if _, pending := c.core.Pending(); pending {
			res.Wake = c.core.Deadline()
		}
		return
	}
	d, err := c.core.Decide(now)
	if err != nil {
		res.Err = err
		return
	}
	if err := c.updates(now, d.Updates, res); err != nil {
		res.Err = err
	}
}

func (c *RebalancerCoordinator) updates(now time.Time, ups []rebalancer.Update, res *TickResult) error {
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
