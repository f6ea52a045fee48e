package simulations

import (
	"slices"
	"time"

	"github.com/quotientlabs/quotient/rebalancer"
)

// Transfers between decisions (asks and gives, rebalancer.Config.Transfers)
// in the simulator's coordinator, as the production driver runs them:
//
//   - Pressure. The gateways flush their usage every GatewayFlushInterval
//     (whole seconds of the region's clock); at each flush the
//     coordinator's model takes what was counted since the previous one.
//     A key whose demand exceeded what was admitted in that flush (a
//     rejection: the gateways' pressure mark) is under pressure, with its
//     demand rate over the flush interval. The coordinator reads the marks
//     PressurePollDelay after the flush (its poll runs every second with
//     its own phase; half a second is the average wait), or
//     PressureWakeDelay after it when the region's pressure changed: the
//     flush marked a key the one before did not, or a key the one before
//     marked has no demand in it (the flush's wake token wakes it:
//     limiter.UsagePressureWakeKey, rebalancer.PressureWaker), and calls
//     Core.Pressure; an Ask goes on
//     the scenario's bus (latency, jitter, loss, duplication and
//     partitions, as reports).
//   - Asks. Core.ReceiveAsk is given this region's demand rates of the
//     last flush interval (the asked keys' recent usage). Its updates are
//     written first; the Give is published only when they were written
//     (the store is up and nothing older is unwritten), else dropped.
//   - Gives. Core.ReceiveGive's updates are written like a decision's:
//     kept while the store is down, and no report is published until they
//     are written.
//
// The counts (Core.Stats: Asks, Gives, Accepted, Refused) say what the
// transfers cost on the bus.

// PressurePollDelay is how long after a gateway flush the simulator's
// coordinator reads the pressure marks: the average phase of a 1 s poll.
const PressurePollDelay = 500 * time.Millisecond

// PressureWakeDelay is PressurePollDelay for a flush that changes the
// region's pressure (see flushAt): the gateway pushes the wake token then
// (limiter.UsagePressureWakeKey), which reaches the coordinator's BLPOP
// within a round trip, and the read takes another (10 ms covers both on a
// loaded machine). Flushes that mark the same keys as the one before wake
// nobody: the coordinator reads them at its interval.
const PressureWakeDelay = 10 * time.Millisecond

// flushState is the coordinator's model of the gateways' flushes.
type flushState struct {
	started   bool
	nextFlush time.Time                // the next flush instant (region clock)
	prev      map[rebalancer.Key]Usage // counted since the epoch boundary, at the last flush
	recent    []rebalancer.Pressure    // demand rate of every key of the last flush interval
	marked    []rebalancer.Pressure    // the keys under pressure in it
	pollAt    time.Time                // when to read marked (zero: nothing to read)
	// prevMarked is the keys marked at the flush before.
	prevMarked map[rebalancer.Key]bool
}

// flushAt takes the flush at now: served is what the gateways counted
// since the epoch boundary (boundary: the whole epoch, after which the
// counts start over).
func (c *RebalancerCoordinator) flushAt(now time.Time, served []Usage, boundary bool) {
	f := &c.fl
	if f.prev == nil {
		f.prev = map[rebalancer.Key]Usage{}
	}
	first := !f.started
	f.started = true
	f.recent, f.marked = f.recent[:0], f.marked[:0]
	interval := GatewayFlushInterval
	for _, u := range served {
		if _, global := c.defaults[u.Policy]; !global {
			continue
		}
		k := rebalancer.Key{PolicyID: u.Policy, Subject: u.Subject.Key()}
		p := f.prev[k]
		d, a := u.Demand-p.Demand, u.Admitted-p.Admitted
		if !boundary {
			f.prev[k] = u
		}
		if first || d <= 0 {
			continue
		}
		rate := d * 1000 * int64(time.Second) / int64(interval)
		f.recent = append(f.recent, rebalancer.Pressure{Key: k, DemandMilli: rate})
		if d > a {
			f.marked = append(f.marked, rebalancer.Pressure{Key: k, DemandMilli: rate})
		}
	}
	if boundary {
		clear(f.prev)
	}
	slices.SortFunc(f.recent, func(a, b rebalancer.Pressure) int { return compareKey(a.Key, b.Key) })
	slices.SortFunc(f.marked, func(a, b rebalancer.Pressure) int { return compareKey(a.Key, b.Key) })
	// Polled even when nothing is marked: a key absent from a poll is no
	// longer under pressure (see rebalancer.Core.Pressure).
	delay := PressurePollDelay
	marked := make(map[rebalancer.Key]bool, len(f.marked))
	for _, p := range f.marked {
		marked[p.Key] = true
		if !f.prevMarked[p.Key] {
			delay = PressureWakeDelay
		}
	}
	active := make(map[rebalancer.Key]bool, len(f.recent))
	for _, p := range f.recent {
		active[p.Key] = true
	}
	for k := range f.prevMarked {
		if !active[k] {
			delay = PressureWakeDelay // the traffic of a pressured key left
		}
	}
	f.prevMarked = marked
	f.pollAt = now.Add(delay)
	f.nextFlush = now.Truncate(GatewayFlushInterval).Add(GatewayFlushInterval)
}

func compareKey(a, b rebalancer.Key) int {
	if a.PolicyID != b.PolicyID {
		if a.PolicyID < b.PolicyID {
			return -1
		}
		return 1
	}
	switch {
	case a.Subject < b.Subject:
		return -1
	case a.Subject > b.Subject:
		return 1
	}
	return 0
}

// transfers does what is due at now: the flush (a wake-up at a whole
// second), the pressure poll and the Core's re-ask (Core.Reask).
func (c *RebalancerCoordinator) transfers(now time.Time, res *TickResult) {
	if !c.core.Config().Transfers {
		return
	}
	f := &c.fl
	if f.started && !now.Before(f.nextFlush) && c.info.Served != nil {
		c.flushAt(now, c.info.Served(), false)
	}
	if !f.pollAt.IsZero() && !now.Before(f.pollAt) {
		f.pollAt = time.Time{}
		if ask := c.core.Pressure(now, f.marked); ask != nil {
			res.Publish = append(res.Publish, ask)
		}
	}
	if at := c.core.ReaskAt(); !at.IsZero() && !now.Before(at) {
		if ask := c.core.Reask(now); ask != nil {
			res.Publish = append(res.Publish, ask)
		}
	}
}

// transferWake is the earliest transfer wake-up after now (zero: none).
func (c *RebalancerCoordinator) transferWake() time.Time {
	if !c.core.Config().Transfers || !c.fl.started {
		return time.Time{}
	}
	w := c.fl.nextFlush
	if p := c.fl.pollAt; !p.IsZero() && p.Before(w) {
		w = p
	}
	if r := c.core.ReaskAt(); !r.IsZero() && r.Before(w) {
		w = r
	}
	return w
}

// receiveAsk answers an Ask: the lowered shares are written, then the
// Give published; a Give whose updates could not be written is dropped.
func (c *RebalancerCoordinator) receiveAsk(now time.Time, ask *rebalancer.Ask, res *TickResult) error {
	ups, give, err := c.core.ReceiveAsk(now, ask, c.fl.recent)
	if err != nil {
		return err
	}
	if err := c.updates(now, ups, res); err != nil {
		return err
	}
	if give != nil {
		if len(c.unwritten) > 0 {
			c.droppedGives++
			return nil
		}
		res.Publish = append(res.Publish, give)
	}
	return nil
}

// receiveGive applies a Give (its updates written as a decision's).
func (c *RebalancerCoordinator) receiveGive(now time.Time, g *rebalancer.Give, res *TickResult) error {
	ups, err := c.core.ReceiveGive(now, g)
	if err != nil {
		return err
	}
	return c.updates(now, ups, res)
}

// DroppedGives is how many Gives this coordinator did not publish because
// their updates could not be written (the store was down).
func (c *RebalancerCoordinator) DroppedGives() int64 { return c.droppedGives }
