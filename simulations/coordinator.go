package simulations

import (
	"slices"
	"time"

	"github.com/quotientlabs/quotient/dailyquota"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
)

// Coordinator is the seam between the engine and one region's coordinator:
// the engine calls it at the region's epoch boundaries (on the region's own,
// possibly skewed, clock) and whenever it asks to be woken, hands it the
// messages the bus delivers, publishes what it returns on the bus and
// installs the shares it returns in the region's store.
//
// The engine calls one Coordinator from one goroutine, in virtual time; an
// implementation must not block, read a clock or use global randomness.
// A coordinator_down fault is a crash: from its start the engine calls
// neither method, and the usage of epochs that end while it is down is lost.
// When it ends the engine builds a new Coordinator for the region (a
// restarted process: every state is lost, so a rebalancer warms up) and
// first hands it, in order, the messages delivered to the region that a
// restarted consumer would read again: those sent within its ReplayWindow
// before the restart (Replayer), by default those sent since the crash (a
// consumer group resuming at its committed offsets).
type Coordinator interface {
	// Receive hands over a message another region's coordinator published,
	// at now (this region's clock), and applies what the coordinator asks
	// in return (a coordinator may decide an epoch as soon as its view is
	// complete). The payload is shared with every other delivery of the
	// same message (duplicates included): read it, never modify it.
	Receive(now time.Time, msg Message) TickResult
	// Tick runs at now (this region's clock). At an epoch boundary
	// (boundary true) usage holds what the region's gateways counted since
	// the previous boundary, one entry per policy and subject with nonzero
	// demand, sorted; at a wake-up it is nil. The engine owns usage only
	// for the duration of the call.
	Tick(now time.Time, boundary bool, usage []Usage) TickResult
}

// Message is what crosses the bus: a payload published by region From
// (an index into Scenario.Regions). The engine does not look inside.
type Message struct {
	From    int
	Payload any
}

// Usage is one region's gateway counts for one policy and subject over one
// epoch, in cost units. Demand counts every attempt, admitted or not.
type Usage struct {
	Policy   string
	Subject  limiter.Subject
	Demand   int64
	Admitted int64
}

// ShareUpdate installs a region's share of a global bucket policy for one
// subject: what limiter.MemoryStore.SetShare takes.
type ShareUpdate struct {
	Policy     string
	Subject    limiter.Subject
	RateMilli  int64         // thousandths of a token per second
	BurstMilli int64         // thousandths of a token
	TTL        time.Duration // <= 0: no expiry
}

// WindowCount says region Region had admitted Count cost units in the
// window starting at WindowStartMs (Unix ms, length WindowMs) of a global
// fixed-window policy for one subject.
type WindowCount struct {
	Policy                  string
	Subject                 limiter.Subject
	WindowStartMs, WindowMs int64
	Region                  string
	Count                   int64
}

// WindowCap sets (Cap >= 0) or removes (Cap < 0) this region's cap in the
// window starting at WindowStartMs (Unix ms, length WindowMs) of a global
// fixed-window policy for one subject: what
// limiter.MemoryStore.SetWindowCap takes (the remainder split of issue 6).
type WindowCap struct {
	Policy                  string
	Subject                 limiter.Subject
	WindowStartMs, WindowMs int64
	Cap                     int64
}

// TickResult is what one Tick or Receive asks of the engine.
type TickResult struct {
	// Publish is sent on the bus to every other region.
	Publish []any
	// Shares are installed in the region's store at the Tick's time.
	Shares []ShareUpdate
	// Wake, when not zero, asks for a wake-up Tick at that time (this
	// region's clock) if it comes after now and before the next epoch
	// boundary; a coordinator uses it for its bounded wait for late
	// reports. Several wake-ups may be pending; each one Ticks.
	Wake time.Time
	// Windows are replicated fixed-window counts to merge into the
	// region's store (limiter.MemoryStore.MergeWindowCount): the seam for
	// the daily-quota replication of issue 6.
	Windows []WindowCount
	// Caps are this region's window caps to set in its store
	// (limiter.MemoryStore.SetWindowCap), after Windows.
	Caps []WindowCap
	// Err, when set, aborts the run as an internal error (a coordinator
	// that cannot go on); the rest of the result is ignored.
	Err error
}

// RegionInfo tells a new Coordinator where it runs.
type RegionInfo struct {
	// Self is this region's index into Regions.
	Self    int
	Regions []string
	// Epoch is the rebalance interval; epoch boundaries are multiples of it
	// since the Unix epoch on the region's clock.
	Epoch time.Duration
	// Policies are the scenario's policies (all scope global).
	Policies []*limiter.Policy
	// Subject maps an encoded subject (limiter.Subject.Key) of a key the
	// scenario's traffic uses back to the subject.
	Subject func(encoded string) (limiter.Subject, bool)
	// WindowCounts reads this region's store's replicated window state
	// of one subject and global fixed-window policy at now (what a
	// daily-quota replicator reads from its region's Redis).
	WindowCounts func(now time.Time, subject limiter.Subject, policyID string) limiter.WindowCounts
	// Served returns what this region's gateways have counted since its
	// last epoch boundary, in the form of Tick's usage (the engine's own
	// records; what a daily-quota replicator learns from the gateways'
	// usage counts to find the active keys). The caller owns the result.
	Served func() []Usage
	// StoreDown reports whether the region's store is down at now (this
	// region's clock; fault store_down): a coordinator's writes to it fail
	// then. Nil: never. The engine applies the shares a TickResult returns
	// whatever it says, so a coordinator models failed writes by holding
	// its updates (RebalancerCoordinator does, as the production driver).
	StoreDown func(now time.Time) bool
	// LastReport returns when (this region's clock) a coordinator of this
	// region last published a usage report (*rebalancer.Report), and
	// false when none ever did: what the bus would show a starting
	// coordinator (rebalancer.DriverConfig.History). Nil: unknown.
	LastReport func() (time.Time, bool)
}

// Replayer is implemented by a Coordinator that says how far back a
// restarted instance of it re-reads the bus (see Coordinator): the
// production coordinator's report consumer starts at its lookback, the
// daily-quota replication reads its compacted topic from the start.
type Replayer interface {
	// ReplayWindow is how long before its restart the oldest message a
	// new instance reads was sent.
	ReplayWindow() time.Duration
}

// replayWindow is c's ReplayWindow, or downFor (what was sent since the
// crash) when c does not say.
func replayWindow(c Coordinator, downFor time.Duration) time.Duration {
	if rp, ok := c.(Replayer); ok {
		return rp.ReplayWindow()
	}
	return downFor
}

// replay hands a restarted c a message sent age before its restart, after
// an outage of downFor, when c would read it again; combined coordinators
// decide per part.
func replay(c Coordinator, now time.Time, msg Message, age, downFor time.Duration) TickResult {
	if cs, ok := c.(*combined); ok {
		results := make([]TickResult, 0, len(cs.cs))
		for _, p := range cs.cs {
			if age <= replayWindow(p, downFor) {
				results = append(results, p.Receive(now, msg))
			}
		}
		return cs.merge(now, results)
	}
	if age <= replayWindow(c, downFor) {
		return c.Receive(now, msg)
	}
	return TickResult{}
}

// Combine runs several coordinators in one region (the rebalancer and the
// daily-quota replication share a coordinator process): every call goes to
// each in order and their results are concatenated. A TickResult holds one
// wake-up, so the earliest asked for is returned and the others are kept
// and returned by later calls (at the latest by the Tick of that earliest
// wake-up), so none is lost; every coordinator gets the others' wake-up
// Ticks too, which coordinators must tolerate. Each must ignore payloads
// that are not its own.
func Combine(builders ...NewCoordinator) NewCoordinator {
	return func(info RegionInfo) (Coordinator, error) {
		cs := &combined{}
		for _, b := range builders {
			c, err := b(info)
			if err != nil {
				return nil, err
			}
			cs.cs = append(cs.cs, c)
		}
		return cs, nil
	}
}

type combined struct {
	cs []Coordinator
	// wakes asked for and not yet handed to the engine, sorted.
	wakes []time.Time
}

func (cs *combined) merge(now time.Time, results []TickResult) TickResult {
	var out TickResult
	for _, r := range results {
		if r.Err != nil {
			return TickResult{Err: r.Err}
		}
		out.Publish = append(out.Publish, r.Publish...)
		out.Shares = append(out.Shares, r.Shares...)
		out.Windows = append(out.Windows, r.Windows...)
		out.Caps = append(out.Caps, r.Caps...)
		if !r.Wake.IsZero() {
			cs.wakes = append(cs.wakes, r.Wake)
		}
	}
	slices.SortFunc(cs.wakes, time.Time.Compare)
	cs.wakes = slices.CompactFunc(cs.wakes, time.Time.Equal)
	i := 0
	for i < len(cs.wakes) && !cs.wakes[i].After(now) {
		i++
	}
	cs.wakes = cs.wakes[i:]
	if len(cs.wakes) > 0 {
		out.Wake = cs.wakes[0]
		cs.wakes = cs.wakes[1:]
	}
	return out
}

func (cs *combined) Receive(now time.Time, msg Message) TickResult {
	results := make([]TickResult, len(cs.cs))
	for i, c := range cs.cs {
		results[i] = c.Receive(now, msg)
	}
	return cs.merge(now, results)
}

func (cs *combined) Tick(now time.Time, boundary bool, usage []Usage) TickResult {
	results := make([]TickResult, len(cs.cs))
	for i, c := range cs.cs {
		results[i] = c.Tick(now, boundary, usage)
	}
	return cs.merge(now, results)
}

// NewCoordinator builds the coordinator of one region. It may fail on a
// configuration it cannot run; the run then fails as an internal error.
type NewCoordinator func(info RegionInfo) (Coordinator, error)

// StaticCoordinator is the stand-in coordinator: it publishes nothing and
// installs no share, so every region enforces the limiter's default share,
// a fixed L/n of every global bucket, and enforces fixed windows on its own
// counts. It is the baseline the real rebalancer must beat, and what the
// engine uses until that core exists.
type StaticCoordinator struct{}

// NewStaticCoordinator is a NewCoordinator for StaticCoordinator.
func NewStaticCoordinator(RegionInfo) (Coordinator, error) { return StaticCoordinator{}, nil }

// Receive implements Coordinator; it ignores msg.
func (StaticCoordinator) Receive(time.Time, Message) TickResult { return TickResult{} }

// Tick implements Coordinator; it asks for nothing.
func (StaticCoordinator) Tick(time.Time, bool, []Usage) TickResult { return TickResult{} }

// DefaultCoordinator builds the coordinator runs use when Options names
// none: the production rebalancer core with its default configuration
// (the epoch comes from the scenario) and, when the scenario has global
// fixed windows, combined with the production daily-quota replication with
// its defaults (NewDailyQuotaCoordinator), as in a coordinator process.
func DefaultCoordinator(info RegionInfo) (Coordinator, error) {
	reb := NewRebalancerCoordinator(rebalancer.DefaultConfig())
	if len(WindowPolicies(info.Policies)) == 0 {
		return reb(info)
	}
	return Combine(reb, NewDailyQuotaCoordinator(dailyquota.DefaultDriverConfig("", nil, nil)))(info)
}
