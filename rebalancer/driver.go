package rebalancer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/quotientlabs/quotient/shares"
)

// Clock is the driver's time source. Nil in DriverConfig means the system
// clock. Implementations must be safe for concurrent use.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTimer returns a channel that receives once, d from now, and a
	// function that stops the timer (reporting whether it was running).
	NewTimer(d time.Duration) (<-chan time.Time, func() bool)
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) NewTimer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// Fence orders the collections of one region across the replicas of its
// coordinator (region/membership.Fence in production): a driver collects
// an epoch, and publishes its report, only after claiming it, and an epoch
// is claimed once, in increasing order. Implementations must be safe for
// concurrent use.
type Fence interface {
	// Last returns the last epoch claimed in this region, and false when
	// none was. An error means it is unknown.
	Last(ctx context.Context) (int64, bool, error)
	// Claim claims epoch for this driver: true when it may collect it (no
	// replica claimed it or a later one), false when another replica did.
	// An error means nothing is known: the driver does not collect the
	// epoch yet and claims it again after RetryInterval.
	Claim(ctx context.Context, epoch int64) (bool, error)
}

// ErrFenced is returned by Run when another replica claimed an epoch this
// driver was about to collect: this replica no longer leads its region.
var ErrFenced = errors.New("rebalancer: epoch claimed by another replica")

// Observer receives what a Driver does, for metrics. Its methods are called
// from the driver's goroutine, one at a time; they must not block and must
// not keep the values' slices.
type Observer interface {
	// Collected is called after each collection, once its report's
	// publication ended (the report is published in the background, so
	// decisions, reports received and transfers may be observed in
	// between; always before the next collection's).
	Collected(CollectInfo)
	// Decided is called after each decision, once its updates were
	// written or failed to be.
	Decided(DecideInfo)
	// Received is called for every report taken from the bus.
	Received(ReceiveInfo)
}

// CollectInfo describes one collection.
type CollectInfo struct {
	Epoch      int64         // the epoch collected
	UsageKeys  int           // usage entries read from the source
	ReportKeys int           // keys in the published report (0 during warm-up; a delta lists only what changed)
	ReportBase int64         // the report's Base: > 0 for a delta (Config.Deltas), 0 for a full report
	Published  bool          // a report was published
	Read       time.Duration // reading the usage
	Publish    time.Duration // writing pending updates and publishing
	UsageErr   error         // reading failed (or Collect refused the usage)
	// UsageUnknown: reading failed, so the epoch was collected with its
	// demand unknown (Core.CollectUnknown: smoothed demand and shares held).
	UsageUnknown bool
	// UsageIncomplete: the source returned the usage as a lower bound
	// (ErrUsageIncomplete: a gateway dropped counts), so the epoch was
	// collected with Core.CollectIncomplete (no key's demand lowered, no
	// share given up at collection). UsageErr says why.
	UsageIncomplete bool
	PublishErr      error     // pending updates or the publication failed: nothing published
	CoreKeys        int       // keys the Core holds state for
	CoreStats       Stats     // the Core's counters after the collection
	CollectedAt     time.Time // when the collection started
}

// DecideInfo describes one decision.
type DecideInfo struct {
	Decision Decision // the Core's decision (Updates included; do not keep)
	Late     bool     // made by Collect because the epoch was not decided in time
	// Duration is the end-to-end cost of the epoch for this region: from
	// the start of its collection to the end of this decision's writes.
	Duration time.Duration
	Write    time.Duration // writing the updates
	WriteErr error         // the updates (or earlier ones) are not all written; retried
}

// ReceiveInfo describes one report taken from the bus.
type ReceiveInfo struct {
	Region  string
	Epoch   int64
	Keys    int
	Receipt Receipt       // valid when Err is nil
	Err     error         // the Core rejected the report (wraps ErrReport)
	Lag     time.Duration // from the end of the report's epoch to its receipt
}

// DriverConfig configures a Driver. Usage, Shares and Bus are required.
type DriverConfig struct {
	Usage  UsageSource // this region's flushed usage
	Shares ShareSink   // this region's share records
	Bus    Bus         // every region's reports
	// Clock is the time source. Default: the system clock.
	Clock Clock
	// CollectDelay is how long after an epoch ends the driver collects it,
	// so the gateways' last flush of the epoch (every second by default)
	// lands first. 0 <= CollectDelay < the Core's MaxWait. Default:
	// DefaultCollectDelay(MaxWait), the smaller of 1 s and MaxWait/2.
	CollectDelay time.Duration
	// IOTimeout bounds each call to Usage, Shares and Bus.Publish.
	// Default: Epoch/2.
	IOTimeout time.Duration
	// RetryInterval is how long the driver waits before writing failed
	// updates again. Default: the smaller of 1 s and Epoch/10.
	RetryInterval time.Duration
	// Logger receives failures. Default: discard.
	Logger *slog.Logger
	// Observer receives what the driver does. Default: none.
	Observer Observer
	// Fence, when set, makes this driver one of several replicas of the
	// region's coordinator: Run starts at the epoch after the last one
	// claimed (see CatchUpEpochs), claims every epoch before collecting
	// it, and returns ErrFenced when another replica claimed it. Default:
	// none (a single replica; the first collection is at the end of the
	// current epoch).
	Fence Fence
	// CatchUpEpochs bounds, with a Fence, how far back Run resumes: the
	// epochs after the last claimed one that ended at most CatchUpEpochs
	// epochs ago are collected at once, in order, so a leader change
	// leaves no epoch uncollected; older ones are skipped and logged
	// (their usage has expired: the gateways keep it 3 epochs after its
	// own). Default 3.
	CatchUpEpochs int64
	// Records, with a Fence, lets a driver that takes over a region (the
	// fence shows the previous epoch claimed) start from the region's share
	// records instead of warming up: after claiming its first epoch it
	// waits until the previous replica can no longer write (see the package
	// doc, "Warm start"), reads the records and adopts them (Core.Adopt),
	// so its first report is published. A read that fails falls back to the
	// warm-up. Default: none (always warm up).
	Records RecordSource
	// History, when set, lets a driver whose region published no report
	// recently skip the warm-up (Core.StartFresh; package doc, "First
	// start"): before its first collection, of epoch f, Run asks it
	// whether the bus holds a report of this region in a record
	// timestamped at or after the start of epoch f-FirstStartEpochs minus
	// one epoch (the clock assumption's margin), and starts fresh only
	// when it answers no without error. Not used when the driver adopts
	// records (a takeover). A report found, an error or a timeout
	// (IOTimeout) leave the warm-up. Default: none (always warm up).
	History ReportHistory
	// TakeoverMargin is added to the wait before adopting records: the
	// bound on the clock difference between replicas of one region plus
	// scheduling delays. Default: RetryInterval.
	TakeoverMargin time.Duration
	// Pressure and Transfers, both set, turn on transfers between
	// decisions (the Core's Config.Transfers decides whether it asks and
	// gives): every PressureInterval the driver reads the pressure marks
	// and publishes the Core's ask; on another region's ask it reads its
	// own demand for the asked keys, writes the shares the Core lowered
	// and only then publishes the give (dropped when the write fails); on
	// a give to this region it writes the raised shares (no report until
	// they are written, as for a decision). Asks and gives are published
	// in the background, at most MaxTransferPublishes at once, each within
	// IOTimeout (a far broker's acknowledgement can take longer than a
	// pressure interval; the epoch loop never waits for it). Default: none
	// (epochs only).
	Pressure  PressureSource
	Transfers TransferBus
	// PressureInterval is how often the pressure marks are read. Default
	// DefaultPressureInterval (1 s).
	PressureInterval time.Duration
}

// Status is a snapshot of a Driver, for health checks.
type Status struct {
	Running        bool      // Run is running
	Started        time.Time // when Run started
	LastCollect    time.Time // zero until the first collection
	LastEpoch      int64     // last epoch collected
	LastDecision   time.Time // zero until the first decision
	LastMode       shares.Mode
	Unwritten      int       // updates waiting to be written again
	LastWriteError error     // the last write failure, nil once a write succeeds
	LastPublish    time.Time // last successful publication
	Transfers      TransferStatus
}

// Driver runs a Core in real time: it owns the Core, a goroutine that
// receives reports, and the timers of the epoch cycle (see the package
// doc). Construct with NewDriver; call Run once. Status is safe for
// concurrent use.
//
// Failure behaviour: a usage read that fails collects the epoch with its
// demand unknown (Core.CollectUnknown): the smoothed demand and the shares
// are held, the report claims what the region enforces, and
// CollectInfo.UsageUnknown says so. The usage stays in the source (which
// removes only what it returns) and is never read again: the next
// collection reads the next epoch. Usage returned with ErrUsageIncomplete
// (a gateway dropped counts at its key bound) is collected with
// Core.CollectIncomplete, and CollectInfo.UsageIncomplete says so.
// Share writes that fail are kept and retried every RetryInterval, newer
// updates of a key replacing older ones; while any are unwritten the
// driver publishes no report (the report would claim shares the store does
// not hold), so the other regions hold, and after SilenceEpochs assume
// this region at the default. A publication that fails is logged; the
// others see an incomplete view and do not grow. Reports, asks and gives
// are published in the background within IOTimeout (the loop goes on
// meanwhile: a far broker's acknowledgement holds no pressure read,
// transfer or decision); a collection waits for the previous report's
// publication to end first.
type Driver struct {
	core  *Core
	cfg   DriverConfig
	clock Clock
	log   *slog.Logger
	epoch time.Duration

	unwritten []Update
	retryAt   time.Time
	cycle     time.Time // start of the current epoch's collection

	// With a Fence: the last epoch claimed and when (see writeDeadline),
	// and the pending warm start (adopt: Run read lastClaimed at readAt).
	hasClaim  bool
	claimed   int64
	claimedAt time.Time
	adopt     bool
	readAt    time.Time

	// The report being published in the background (see publishReport);
	// only Run's goroutine touches these.
	report reportPub

	mu     sync.Mutex
	status Status
}

// reportPub is a Driver's background report publication: one at a time.
type reportPub struct {
	ctx  context.Context
	wg   *sync.WaitGroup
	done chan reportDone // holds one: the goroutine never blocks
	busy bool            // published, not yet received from done
}

// reportDone is a report publication that ended.
type reportDone struct {
	epoch int64
	info  CollectInfo // the collection's, to observe once published
	start time.Time   // when the flush before it started
	err   error
}

// NewDriver returns a driver of core. It does no I/O.
func NewDriver(core *Core, cfg DriverConfig) (*Driver, error) {
	if core == nil {
		return nil, fmt.Errorf("%w: driver: core is nil", ErrConfig)
	}
	switch {
	case cfg.Usage == nil:
		return nil, fmt.Errorf("%w: driver: Usage is nil", ErrConfig)
	case cfg.Shares == nil:
		return nil, fmt.Errorf("%w: driver: Shares is nil", ErrConfig)
	case cfg.Bus == nil:
		return nil, fmt.Errorf("%w: driver: Bus is nil", ErrConfig)
	}
	cc := core.Config()
	if cfg.CollectDelay == 0 {
		cfg.CollectDelay = DefaultCollectDelay(cc.MaxWait)
	}
	if cfg.CollectDelay < 0 || cfg.CollectDelay >= cc.MaxWait {
		return nil, fmt.Errorf("%w: driver: CollectDelay %v not in [0, MaxWait = %v)", ErrConfig, cfg.CollectDelay, cc.MaxWait)
	}
	if cfg.IOTimeout == 0 {
		cfg.IOTimeout = cc.Epoch / 2
	}
	if cfg.IOTimeout < 0 {
		return nil, fmt.Errorf("%w: driver: IOTimeout %v is negative", ErrConfig, cfg.IOTimeout)
	}
	if cfg.RetryInterval == 0 {
		cfg.RetryInterval = min(time.Second, cc.Epoch/10)
	}
	if cfg.RetryInterval < 0 {
		return nil, fmt.Errorf("%w: driver: RetryInterval %v is negative", ErrConfig, cfg.RetryInterval)
	}
	if cfg.CatchUpEpochs == 0 {
		cfg.CatchUpEpochs = 3
	}
	if cfg.CatchUpEpochs < 0 {
		return nil, fmt.Errorf("%w: driver: CatchUpEpochs %d is negative", ErrConfig, cfg.CatchUpEpochs)
	}
	if cfg.TakeoverMargin == 0 {
		cfg.TakeoverMargin = cfg.RetryInterval
	}
	if cfg.TakeoverMargin < 0 {
		return nil, fmt.Errorf("%w: driver: TakeoverMargin %v is negative", ErrConfig, cfg.TakeoverMargin)
	}
	if err := validateTransfers(&cfg); err != nil {
		return nil, err
	}
	d := &Driver{core: core, cfg: cfg, clock: cfg.Clock, log: cfg.Logger, epoch: cc.Epoch}
	if d.clock == nil {
		d.clock = systemClock{}
	}
	if d.log == nil {
		d.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return d, nil
}

// Status returns a snapshot.
func (d *Driver) Status() Status {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.status
}

func (d *Driver) setStatus(f func(*Status)) {
	d.mu.Lock()
	f(&d.status)
	d.mu.Unlock()
}

// Run runs the epoch cycle until ctx ends, then returns ctx.Err(). The
// first collection is at the start of the next epoch (plus CollectDelay);
// with a Fence, it is of the epoch after the last claimed one (see
// CatchUpEpochs), and Run also returns ErrFenced when another replica
// claimed an epoch first, or an error wrapping the fence's when the last
// claimed epoch cannot be read at start. Run must be called at most once.
func (d *Driver) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	now := d.clock.Now()
	d.setStatus(func(s *Status) { s.Running, s.Started = true, now })
	defer d.setStatus(func(s *Status) { s.Running = false })

	// next is the epoch to collect next, at nextCollect (its end plus
	// CollectDelay).
	next := EpochOf(now, d.epoch)
	if d.cfg.Fence != nil {
		fctx, fcancel := context.WithTimeout(ctx, d.cfg.IOTimeout)
		last, ok, err := d.cfg.Fence.Last(fctx)
		fcancel()
		if err != nil {
			return fmt.Errorf("rebalancer: read the last claimed epoch: %w", err)
		}
		if ok {
			next = max(last+1, d.oldestCatchUp(now))
			if next > last+1 {
				d.log.Warn("rebalancer: epochs after the last claimed one are too old to collect", "last_claimed", last, "resume", next)
			}
			// A takeover: the previous replica claimed last, no later
			// than now. (When epochs were skipped, which it may still
			// be claiming is unknown: warm up.)
			d.adopt = d.cfg.Records != nil && next == last+1 && !d.core.Adopted()
			d.readAt = d.clock.Now()
		}
	}

	if d.cfg.History != nil && !d.adopt && !d.core.Adopted() {
		d.firstStart(ctx, next)
	}

	reports := make(chan *Report, 64)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		d.receive(ctx, reports)
	}()
	tr := d.startTransfers(ctx, &wg)
	d.report = reportPub{ctx: ctx, wg: &wg, done: make(chan reportDone, 1)}
	defer wg.Wait()
	defer cancel()

	nextCollect := EpochStart(next+1, d.epoch).Add(d.cfg.CollectDelay)
	for {
		now = d.clock.Now()
		if !now.Before(nextCollect) {
			if d.cfg.Fence == nil {
				next = EpochOf(now, d.epoch) - 1
			} else {
				next = max(next, d.oldestCatchUp(now))
			}
			switch err := d.collect(ctx, next, now); {
			case errors.Is(err, ErrFenced):
				return err
			case err != nil: // the claim failed: try again soon
				nextCollect = now.Add(d.cfg.RetryInterval)
			default:
				next++
				nextCollect = EpochStart(next+1, d.epoch).Add(d.cfg.CollectDelay)
			}
			now = d.clock.Now()
		}
		if d.core.Due(now) {
			d.decide(ctx, now)
			now = d.clock.Now()
		}
		if len(d.unwritten) > 0 && !now.Before(d.retryAt) {
			_ = d.flush(ctx)
			now = d.clock.Now()
		}
		if tr.due(now) {
			d.pressure(ctx, now, &tr)
			now = d.clock.Now()
		}
		if d.reaskDue(&tr, now) {
			d.reask(&tr, now)
		}
		wake := nextCollect
		if tr.in != nil {
			wake = earliest(wake, tr.next)
			if at := d.core.ReaskAt(); !at.IsZero() {
				wake = earliest(wake, at)
			}
		}
		if _, ok := d.core.Pending(); ok {
			wake = earliest(wake, d.core.Deadline())
		}
		if len(d.unwritten) > 0 {
			wake = earliest(wake, d.retryAt)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		c, stop := d.clock.NewTimer(max(0, wake.Sub(now)))
		select {
		case <-ctx.Done():
			stop()
			return ctx.Err()
		case r := <-reports:
			stop()
			d.apply(r)
		case m := <-tr.in:
			stop()
			d.applyTransfer(ctx, &tr, m)
		case p := <-tr.sent:
			stop()
			tr.inflight--
			d.transferPublished(p)
		case r := <-d.report.done:
			stop()
			d.reportPublished(r)
		case <-tr.wake:
			stop()
			tr.woken(d.clock.Now(), d.pressureGap())
			d.setStatus(func(s *Status) { s.Transfers.Wakes++ })
		case <-c:
		}
	}
}

// firstStart makes the Core skip its warm-up when History shows no report
// of this region recent enough to matter for a first collection of epoch
// f (see DriverConfig.History). Every failure leaves the warm-up.
func (d *Driver) firstStart(ctx context.Context, f int64) {
	cc := d.core.Config()
	since := EpochStart(f-FirstStartEpochs(cc), d.epoch).Add(-d.epoch)
	hctx, cancel := context.WithTimeout(ctx, d.cfg.IOTimeout)
	found, err := d.cfg.History.Published(hctx, cc.Region, since)
	cancel()
	switch {
	case err != nil:
		d.log.Warn("rebalancer: cannot tell a first start from a restart; warming up", "epoch", f, "err", err)
	case found:
		d.log.Info("rebalancer: this region reported recently; warming up", "epoch", f, "since", since)
	default:
		if err := d.core.StartFresh(); err != nil {
			d.log.Warn("rebalancer: start fresh refused; warming up", "err", err)
			return
		}
		d.log.Info("rebalancer: no report of this region since the span a restart needs; skipping the warm-up", "epoch", f, "since", since)
	}
}

// oldestCatchUp is the oldest epoch a fenced driver still collects at now.
func (d *Driver) oldestCatchUp(now time.Time) int64 {
	return EpochOf(now, d.epoch) - 1 - d.cfg.CatchUpEpochs
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// receive moves reports from the bus to the Run loop until ctx ends.
func (d *Driver) receive(ctx context.Context, out chan<- *Report) {
	for {
		r, err := d.cfg.Bus.Receive(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			d.log.Warn("rebalancer: receive failed", "err", err)
			c, stop := d.clock.NewTimer(d.cfg.RetryInterval)
			select {
			case <-ctx.Done():
				stop()
				return
			case <-c:
			}
			continue
		}
		select {
		case out <- r:
		case <-ctx.Done():
			return
		}
	}
}

func (d *Driver) apply(r *Report) {
	now := d.clock.Now()
	receipt, err := d.core.ReceiveAt(now, r)
	info := ReceiveInfo{Receipt: receipt, Err: err}
	if r != nil {
		info.Region, info.Epoch, info.Keys = r.Region, r.Epoch, len(r.Keys)
		info.Lag = now.Sub(EpochStart(r.Epoch+1, d.epoch))
	}
	if err != nil {
		d.log.Warn("rebalancer: report rejected", "err", err)
	}
	if d.cfg.Observer != nil {
		d.cfg.Observer.Received(info)
	}
}

// collect ends epoch m (the one before now's, or an older one a fenced
// driver catches up on): claims it (with a Fence), reads usage, calls
// Collect, writes a late decision and publishes. It returns ErrFenced when
// another replica claimed m, another error when the claim failed (nothing
// was done), nil otherwise.
func (d *Driver) collect(ctx context.Context, m int64, now time.Time) error {
	// The last report's publication ends first: the Core must know
	// whether it was published before it builds the next (delta.go).
	if d.awaitReport(ctx) {
		now = d.clock.Now()
	}
	if d.cfg.Fence != nil {
		if d.adopt {
			// Before claiming: if the previous replica claims m meanwhile,
			// the claim below fails and this Core is dropped.
			d.adopt = false
			d.warmStart(ctx, m)
			now = d.clock.Now()
		}
		claimStart := d.clock.Now()
		fctx, cancel := context.WithTimeout(ctx, d.cfg.IOTimeout)
		ok, err := d.cfg.Fence.Claim(fctx, m)
		cancel()
		if err != nil {
			d.log.Warn("rebalancer: claim failed; retrying", "epoch", m, "err", err)
			return fmt.Errorf("rebalancer: claim epoch %d: %w", m, err)
		}
		if !ok {
			d.log.Info("rebalancer: epoch claimed by another replica; stopping", "epoch", m)
			return fmt.Errorf("%w: epoch %d", ErrFenced, m)
		}
		// Before the claim took effect: a successor that reads the fence
		// after it knows the claim started earlier (see warmStart).
		d.hasClaim, d.claimed, d.claimedAt = true, m, claimStart
	}
	// The Core takes the epoch from the time: a past epoch is collected
	// as at its normal collection time.
	at := now
	if EpochOf(now, d.epoch)-1 != m {
		at = EpochStart(m+1, d.epoch).Add(d.cfg.CollectDelay)
	}
	d.cycle = now
	info := CollectInfo{Epoch: m, CollectedAt: now}
	rctx, cancel := context.WithTimeout(ctx, d.cfg.IOTimeout)
	usage, err := d.cfg.Usage.Usage(rctx, m)
	cancel()
	info.Read = d.clock.Now().Sub(now)
	var pub Published
	if errors.Is(err, ErrUsageIncomplete) {
		info.UsageErr, info.UsageIncomplete, info.UsageKeys = err, true, len(usage)
		d.log.Warn("rebalancer: usage incomplete (a gateway dropped counts at its key bound); no key's demand is lowered this epoch", "epoch", m, "keys", len(usage), "err", err)
		pub, err = d.core.CollectIncomplete(at, usage)
	} else if err != nil {
		info.UsageErr, info.UsageUnknown = err, true
		d.log.Warn("rebalancer: usage read failed; collecting the epoch with its demand unknown (smoothed demand and shares held)", "epoch", m, "err", err)
		pub, err = d.core.CollectUnknown(at)
	} else {
		info.UsageKeys = len(usage)
		pub, err = d.core.Collect(at, usage)
	}
	if err != nil {
		// Only ErrEpochNotOver or ErrUsage: nothing changed.
		d.log.Error("rebalancer: collect failed", "epoch", m, "err", err)
		info.UsageErr = errors.Join(info.UsageErr, err)
		d.observeCollect(info)
		return nil
	}
	if pub.Late != nil {
		d.enqueue(pub.Late.Updates)
		t0 := d.clock.Now()
		werr := d.flush(ctx)
		t1 := d.clock.Now()
		d.observeDecision(*pub.Late, true, t1.Sub(now), t1.Sub(t0), werr)
	}
	// Shrinks decided at collection (Config.ShrinkAtCollect): the report
	// claims them, so they are written before it is published (the flush
	// below runs first and nothing is published while writes fail).
	d.enqueue(pub.Updates)
	d.setStatus(func(s *Status) { s.LastCollect, s.LastEpoch = now, m })
	if pub.Report != nil {
		t0 := d.clock.Now()
		info.ReportKeys, info.ReportBase = len(pub.Report.Keys), pub.Report.Base
		if err := d.flush(ctx); err != nil {
			info.PublishErr = fmt.Errorf("rebalancer: report of epoch %d not published: share updates unwritten: %w", m, err)
			d.core.NotPublished(m) // the next report is full (delta.go)
			d.log.Warn("rebalancer: report not published", "epoch", m, "err", info.PublishErr)
			info.Publish = d.clock.Now().Sub(t0)
		} else {
			d.publishReport(m, pub.Report, info, t0)
			return nil // observed once published (reportPublished)
		}
	}
	d.observeCollect(info)
	return nil
}

// publishReport publishes the report of epoch m in the background, within
// IOTimeout: the pressure reads, asks, gives and decisions go on while a
// far broker acknowledges it (the Core does not wait for its own report
// either: see the package doc). Run gets the result on d.report.done
// (reportPublished), and the next collection waits for it first.
func (d *Driver) publishReport(m int64, r *Report, info CollectInfo, t0 time.Time) {
	rp := &d.report
	rp.busy = true
	ctx, done, timeout, bus := rp.ctx, rp.done, d.cfg.IOTimeout, d.cfg.Bus
	rp.wg.Go(func() {
		pctx, cancel := context.WithTimeout(ctx, timeout)
		err := bus.Publish(pctx, r)
		cancel()
		select {
		case done <- reportDone{epoch: m, info: info, start: t0, err: err}: // one at a time: room for it
		case <-ctx.Done(): // Run is ending (or left one unread: see awaitReport)
		}
	})
}

// awaitReport waits for the report publication in flight, if any, and
// handles it; true when there was one. It returns early only when ctx
// ends (the publication's context ends with it).
func (d *Driver) awaitReport(ctx context.Context) bool {
	if !d.report.busy {
		return false
	}
	select {
	case r := <-d.report.done:
		d.reportPublished(r)
	case <-ctx.Done():
	}
	return true
}

// reportPublished records a report publication that ended and observes
// its collection.
func (d *Driver) reportPublished(r reportDone) {
	d.report.busy = false
	info := r.info
	if r.err != nil {
		info.PublishErr = fmt.Errorf("rebalancer: publish report of epoch %d: %w", r.epoch, r.err)
		d.core.NotPublished(r.epoch) // the next report is full (delta.go)
		d.log.Warn("rebalancer: report not published", "epoch", r.epoch, "err", info.PublishErr)
	} else {
		info.Published = true
		d.setStatus(func(s *Status) { s.LastPublish = d.clock.Now() })
	}
	info.Publish = d.clock.Now().Sub(r.start)
	d.observeCollect(info)
}

func (d *Driver) observeCollect(info CollectInfo) {
	if d.cfg.Observer == nil {
		return
	}
	info.CoreKeys = d.core.Keys()
	info.CoreStats = d.core.Stats()
	d.cfg.Observer.Collected(info)
}

func (d *Driver) decide(ctx context.Context, now time.Time) {
	dec, err := d.core.Decide(now)
	if err != nil {
		return // nothing pending: Due said otherwise, cannot happen
	}
	d.enqueue(dec.Updates)
	t0 := d.clock.Now()
	werr := d.flush(ctx)
	t1 := d.clock.Now()
	d.observeDecision(dec, false, t1.Sub(d.cycle), t1.Sub(t0), werr)
}

func (d *Driver) observeDecision(dec Decision, late bool, total, write time.Duration, werr error) {
	d.setStatus(func(s *Status) { s.LastDecision, s.LastMode = d.clock.Now(), dec.Mode })
	if d.cfg.Observer != nil {
		d.cfg.Observer.Decided(DecideInfo{Decision: dec, Late: late, Duration: total, Write: write, WriteErr: werr})
	}
}

// enqueue adds updates to the unwritten ones; a newer update of a key
// replaces an older one.
func (d *Driver) enqueue(ups []Update) {
	if len(ups) == 0 {
		return
	}
	if len(d.unwritten) == 0 {
		d.unwritten = ups
		return
	}
	at := make(map[Key]int, len(d.unwritten))
	for i, u := range d.unwritten {
		at[u.Key] = i
	}
	for _, u := range ups {
		if i, ok := at[u.Key]; ok {
			d.unwritten[i] = u
			continue
		}
		at[u.Key] = len(d.unwritten)
		d.unwritten = append(d.unwritten, u)
	}
}

// errWriteWindow: a fenced driver is past its write deadline.
var errWriteWindow = errors.New("rebalancer: past the write deadline of the last claimed epoch; writing after the next claim")

// writeDeadline is when a fenced driver stops starting writes until it
// claims another epoch: the later of the time it would claim the epoch
// after its last claimed one c (the end of epoch c+1 plus CollectDelay)
// and MaxWait after it claimed c (for a catch-up collection, claimed late).
// A replica taking over waits for it (see warmStart).
func (d *Driver) writeDeadline() time.Time {
	byEpoch := EpochStart(d.claimed+2, d.epoch).Add(d.cfg.CollectDelay)
	byClaim := d.claimedAt.Add(d.core.Config().MaxWait)
	if byClaim.After(byEpoch) {
		return byClaim
	}
	return byEpoch
}

// warmStart adopts this region's share records when this driver takes over
// from a replica whose last claimed epoch was m-1, read at d.readAt, before
// claiming m. If the claim of m then succeeds, that replica claimed nothing
// after m-1 (it would have claimed m or later, and the claim would fail),
// and it started claiming m-1 before readAt; so it started its last write
// before its write deadline, at most max(EpochStart(m+1)+CollectDelay,
// readAt+MaxWait), and the write ended within IOTimeout. After that, plus
// TakeoverMargin, the records are what the gateways enforce and nothing
// else writes them. If the claim fails, the driver stops (ErrFenced) and
// the adopted Core is never used. Failures leave the Core cold (warm-up),
// which is always safe.
func (d *Driver) warmStart(ctx context.Context, m int64) {
	until := EpochStart(m+1, d.epoch).Add(d.cfg.CollectDelay)
	if t := d.readAt.Add(d.core.Config().MaxWait); t.After(until) {
		until = t
	}
	until = until.Add(d.cfg.IOTimeout + d.cfg.TakeoverMargin)
	if wait := until.Sub(d.clock.Now()); wait > 0 {
		c, stop := d.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			stop()
			return
		case <-c:
		}
	}
	rctx, cancel := context.WithTimeout(ctx, d.cfg.IOTimeout)
	recs, err := d.cfg.Records.Records(rctx)
	cancel()
	if err != nil {
		d.log.Warn("rebalancer: share records not read; warming up", "epoch", m, "err", err)
		return
	}
	ups, err := d.core.Adopt(d.clock.Now(), recs)
	if err != nil {
		d.log.Warn("rebalancer: share records not adopted; warming up", "epoch", m, "err", err)
		return
	}
	d.enqueue(ups)
	d.log.Info("rebalancer: took over with the region's share records", "epoch", m, "records", len(recs))
}

// flush writes the unwritten updates; on failure they stay for a retry.
// A fenced driver past its write deadline writes nothing (see
// writeDeadline): the updates wait for its next claim.
func (d *Driver) flush(ctx context.Context) error {
	if len(d.unwritten) == 0 {
		return nil
	}
	if d.cfg.Fence != nil && d.hasClaim && !d.clock.Now().Before(d.writeDeadline()) {
		d.retryAt = d.clock.Now().Add(d.cfg.RetryInterval)
		n := len(d.unwritten)
		d.setStatus(func(s *Status) { s.Unwritten, s.LastWriteError = n, errWriteWindow })
		return errWriteWindow
	}
	wctx, cancel := context.WithTimeout(ctx, d.cfg.IOTimeout)
	err := d.cfg.Shares.Write(wctx, d.unwritten)
	cancel()
	if err != nil {
		d.retryAt = d.clock.Now().Add(d.cfg.RetryInterval)
		d.log.Warn("rebalancer: share write failed; retrying", "updates", len(d.unwritten), "err", err)
	} else {
		d.unwritten = nil
	}
	n := len(d.unwritten)
	d.setStatus(func(s *Status) { s.Unwritten, s.LastWriteError = n, err })
	return err
}
