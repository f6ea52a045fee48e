package rebalancer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/quotientlabs/quotient/shares"
)

// PressureSource is what a driver reads this region's demand between
// collections from (the gateways' pressure marks and usage in Redis:
// rebalancer/redisio). The Core never calls it.
type PressureSource interface {
	// Pressure returns the keys whose policy rejected demand since the
	// last call, each with its demand rate over that time (milli cost
	// units per second), at most a bounded number of them. The first call
	// may return nothing (it has no earlier count to compare with). The
	// caller owns the slice; an error means nothing was read.
	Pressure(ctx context.Context, now time.Time) ([]Pressure, error)
	// Demand returns this region's recent demand rate for each of keys
	// (the current epoch's usage so far), in any order; keys without usage
	// may be missing. The caller owns the slice; an error means nothing
	// was read.
	Demand(ctx context.Context, now time.Time, keys []Key) ([]Pressure, error)
}

// PressureWaker is implemented by a PressureSource that can tell when the
// gateways marked pressure (rebalancer/redisio: a token the gateways'
// flushes push, limiter.UsagePressureWakeKey). A driver whose source
// implements it reads the pressure marks as soon as it is woken (at most
// every PressureInterval/10), then every PressureInterval after that read.
type PressureWaker interface {
	// WaitPressure blocks until the gateways marked pressure since the
	// last call (true), about wait passed (false) or ctx ended (ctx's
	// error). Another error means the source could not be reached; the
	// caller waits before calling again.
	WaitPressure(ctx context.Context, wait time.Duration) (bool, error)
}

// TransferBus carries asks and gives between regions (Kafka, at least
// once: rebalancer/kafkabus). The Core never calls it.
type TransferBus interface {
	// PublishAsk sends an ask to every region. The bus does not keep a.
	PublishAsk(ctx context.Context, a *Ask) error
	// PublishGive sends a give. The bus does not keep g.
	PublishGive(ctx context.Context, g *Give) error
	// ReceiveTransfer blocks until an ask or a give of any region arrives
	// (this one's too; exactly one of the two is set) or ctx ends. The
	// caller owns what it returns.
	ReceiveTransfer(ctx context.Context) (*Ask, *Give, error)
}

// DefaultPressureInterval is how often a driver with transfers reads the
// pressure marks: the gateways' default usage flush interval.
const DefaultPressureInterval = time.Second

// TransferKind says what a TransferInfo describes.
type TransferKind uint8

const (
	// AskSent: this region published an ask (or failed to: Err).
	AskSent TransferKind = iota
	// AskReceived: another region's ask was answered (a give, or nothing).
	AskReceived
	// GiveSent: this region lowered its shares and published a give (or
	// dropped it: Dropped says why).
	GiveSent
	// GiveReceived: a give to this region was accepted (Accepted) or
	// refused.
	GiveReceived
	// PressureFailed: the pressure marks could not be read (Err); nothing
	// was asked.
	PressureFailed
)

// String returns the kind's name.
func (k TransferKind) String() string {
	switch k {
	case AskSent:
		return "ask_sent"
	case AskReceived:
		return "ask_received"
	case GiveSent:
		return "give_sent"
	case GiveReceived:
		return "give_received"
	case PressureFailed:
		return "pressure_failed"
	}
	return "unknown"
}

// Reasons a give was dropped (GiveSent) or refused (GiveReceived), in
// TransferInfo.Reason.
const (
	// ReasonWrite: the giver's lowered shares were not written, so the
	// give was not published (the shares stay lowered, retried).
	ReasonWrite = "write"
	// ReasonPublish: the give was not published (its shares are lowered:
	// the amount is unused until the next decision).
	ReasonPublish = "publish"
	// ReasonCore: the Core refused the give (fallback, warm-up, not the
	// transfer epoch it expects, a duplicate, no key it could raise;
	// TransferInfo.Refusal says which; see Core.ReceiveGiveReason).
	ReasonCore = "core"
	// ReasonError: the Core rejected a malformed give (ErrTransfer).
	ReasonError = "invalid"
)

// TransferInfo describes one ask or give, for metrics.
type TransferInfo struct {
	Kind TransferKind
	// Region is the other region: the asker of a received ask, the
	// receiver of a sent give, the giver of a received give; empty for an
	// ask sent.
	Region string
	Keys   int          // keys asked or given
	Amount shares.Share // the give's amounts summed over its keys (gives only)
	// Accepted: a received give raised some share (GiveReceived). A sent
	// give was published when Reason is empty.
	Accepted bool
	Reason   string // why a give was dropped or refused; empty otherwise
	Err      error  // what failed, if anything
	// Refusal says why a received give raised no share (GiveReceived and
	// not Accepted: RefusedInvalid with Reason ReasonError, any other with
	// ReasonCore); GiveAccepted otherwise.
	Refusal GiveRefusal
}

// TransferObserver is implemented by an Observer that also wants the
// transfers (called like the others: from the driver's goroutine, must
// not block, must not keep the values).
type TransferObserver interface {
	Transferred(TransferInfo)
}

// TransferStatus is the transfer part of a driver's Status.
type TransferStatus struct {
	Enabled       bool      // the driver has a PressureSource and a TransferBus
	LastPressure  time.Time // last pressure read that succeeded
	PressureKeys  int       // keys under pressure at that read
	AsksSent      int64
	AsksReceived  int64 // asks of other regions answered
	GivesSent     int64 // gives published
	GivesDropped  int64 // gives whose write or publication failed
	GivesAccepted int64 // gives to this region accepted
	GivesRefused  int64 // gives to this region refused
	// Wakes counts the pressure reads a PressureWaker woke early.
	Wakes     int64
	LastError error // the last failure of a pressure read, write or publication; nil after a success
}

// transferIn is one message from the transfer bus.
type transferIn struct {
	ask  *Ask
	give *Give
}

// MaxTransferPublishes is how many asks and gives a driver publishes at
// once. Publications run in the background (a produce round trip to a far
// broker can take longer than a pressure interval, and the epoch loop must
// not wait for it); one more while this many are in flight is not
// published: an ask is asked again after AskInterval, a give's amount is
// unused until the next decision (as when its publication fails).
const MaxTransferPublishes = 4

// transferLoop is the Run loop's transfer state; the zero value (in is nil)
// means no transfers. Only the Run loop's goroutine touches it.
type transferLoop struct {
	in       chan transferIn
	wake     chan struct{}        // a PressureWaker woke the loop (nil: no waker)
	sent     chan transferPublish // publications that ended
	inflight int                  // publications started and not yet in sent
	ctx      context.Context      // Run's: ends the publications
	wg       *sync.WaitGroup      // Run's: waits for the publications
	next     time.Time            // the next pressure read
	last     time.Time            // the last pressure read (zero: none yet)
}

// transferPublish is one ask or give (exactly one is set) being
// published, with what to report once it ended.
type transferPublish struct {
	ask  *Ask
	give *Give
	info TransferInfo // AskSent or GiveSent
	err  error        // the publication's
}

// errPublishesBusy: MaxTransferPublishes publications were in flight.
var errPublishesBusy = fmt.Errorf("%d publications in flight", MaxTransferPublishes)

// publish starts publishing p in the background, within IOTimeout; the
// Run loop gets it back on tr.sent once it ended (transferPublished). When
// MaxTransferPublishes are in flight it publishes nothing and reports p
// at once with errPublishesBusy.
func (d *Driver) publish(tr *transferLoop, p transferPublish) {
	if tr.inflight >= MaxTransferPublishes {
		p.err = errPublishesBusy
		d.transferPublished(p)
		return
	}
	tr.inflight++
	ctx, sent, timeout, bus := tr.ctx, tr.sent, d.cfg.IOTimeout, d.cfg.Transfers
	tr.wg.Go(func() {
		pctx, cancel := context.WithTimeout(ctx, timeout)
		if p.ask != nil {
			p.err = bus.PublishAsk(pctx, p.ask)
		} else {
			p.err = bus.PublishGive(pctx, p.give)
		}
		cancel()
		select {
		case sent <- p: // never blocks: sent holds MaxTransferPublishes
		case <-ctx.Done():
		}
	})
}

// transferPublished logs and reports a publication that ended.
func (d *Driver) transferPublished(p transferPublish) {
	info := p.info
	switch {
	case p.ask != nil && p.err != nil:
		info.Err = fmt.Errorf("rebalancer: publish ask (%d keys): %w", len(p.ask.Keys), p.err)
		d.log.Warn("rebalancer: ask not published; asked again after AskInterval", "err", info.Err)
	case p.ask != nil:
		d.log.Debug("rebalancer: ask published", "epoch", p.ask.Epoch, "keys", len(p.ask.Keys), "need_milli", p.ask.Keys[0].Need.RateMilli)
	case p.err != nil:
		info.Reason, info.Err = ReasonPublish, fmt.Errorf("rebalancer: give %d to %s not published (its amount is unused until the next decision): %w", p.give.ID, p.give.To, p.err)
		d.log.Warn("rebalancer: give not published", "err", info.Err)
	default:
		d.log.Debug("rebalancer: give published", "to", p.give.To, "id", p.give.ID, "transfer_epoch", p.give.Transfer, "keys", len(p.give.Keys), "rate_milli", info.Amount.RateMilli)
	}
	d.observeTransfer(info)
}

// due reports whether a pressure read is due at now.
func (tr *transferLoop) due(now time.Time) bool {
	return tr.in != nil && !now.Before(tr.next)
}

// woken moves the next pressure read to now, or to gap after the last
// one if that is later.
func (tr *transferLoop) woken(now time.Time, gap time.Duration) {
	at := tr.last.Add(gap)
	if at.Before(now) {
		at = now
	}
	if at.Before(tr.next) {
		tr.next = at
	}
}

// pressureGap is the shortest time between two pressure reads, when a
// PressureWaker wakes the driver: a tenth of the interval.
func (d *Driver) pressureGap() time.Duration {
	return d.cfg.PressureInterval / 10
}

// startTransfers starts the transfer receiver in wg when the driver has
// transfers configured, and the pressure waker when its PressureSource is
// one.
func (d *Driver) startTransfers(ctx context.Context, wg *sync.WaitGroup) transferLoop {
	if d.cfg.Transfers == nil || d.cfg.Pressure == nil {
		return transferLoop{}
	}
	tr := transferLoop{
		in: make(chan transferIn, 64), sent: make(chan transferPublish, MaxTransferPublishes),
		ctx: ctx, wg: wg, next: d.clock.Now().Add(d.cfg.PressureInterval),
	}
	d.setStatus(func(s *Status) { s.Transfers.Enabled = true })
	wg.Go(func() {
		for {
			a, g, err := d.cfg.Transfers.ReceiveTransfer(ctx)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				d.log.Warn("rebalancer: transfer receive failed", "err", err)
				if !d.sleep(ctx, d.cfg.RetryInterval) {
					return
				}
				continue
			}
			select {
			case tr.in <- transferIn{ask: a, give: g}:
			case <-ctx.Done():
				return
			}
		}
	})
	if w, ok := d.cfg.Pressure.(PressureWaker); ok {
		wake := make(chan struct{}, 1)
		tr.wake = wake
		wg.Go(func() {
			for {
				ok, err := w.WaitPressure(ctx, d.cfg.PressureInterval)
				if ctx.Err() != nil {
					return
				}
				if err != nil {
					// The reads every PressureInterval go on (and
					// report the failure); retry the wait later.
					d.log.Debug("rebalancer: pressure wake-up failed", "err", err)
					if !d.sleep(ctx, d.cfg.RetryInterval) {
						return
					}
					continue
				}
				if ok {
					select {
					case wake <- struct{}{}:
					default: // a wake-up is pending already
					}
				}
			}
		})
	}
	return tr
}

// sleep waits dt on the driver's clock; false when ctx ended first.
func (d *Driver) sleep(ctx context.Context, dt time.Duration) bool {
	c, stop := d.clock.NewTimer(dt)
	defer stop()
	select {
	case <-ctx.Done():
		return false
	case <-c:
		return true
	}
}

// transferTimeout bounds one read of the pressure marks or of this
// region's demand (the region's own Redis): a transfer is worth something
// for about a pressure interval. Publications take IOTimeout (publish).
func (d *Driver) transferTimeout() time.Duration {
	return min(d.cfg.IOTimeout, max(d.cfg.PressureInterval, 500*time.Millisecond))
}

func (d *Driver) observeTransfer(info TransferInfo) {
	d.setStatus(func(s *Status) {
		t := &s.Transfers
		switch info.Kind {
		case AskSent:
			if info.Err == nil {
				t.AsksSent++
			}
		case AskReceived:
			t.AsksReceived++
		case GiveSent:
			if info.Reason == "" {
				t.GivesSent++
			} else {
				t.GivesDropped++
			}
		case GiveReceived:
			if info.Accepted {
				t.GivesAccepted++
			} else {
				t.GivesRefused++
			}
		}
		if info.Err != nil {
			t.LastError = info.Err
		}
	})
	if o, ok := d.cfg.Observer.(TransferObserver); ok {
		o.Transferred(info)
	}
}

// pressure reads the pressure marks, passes them to the Core (a failed
// read passes nothing: the keys stay under pressure for two AskIntervals)
// and publishes its ask (in the background: see publish). The next read
// is an interval later (or sooner, when woken).
func (d *Driver) pressure(ctx context.Context, now time.Time, tr *transferLoop) {
	tr.last, tr.next = now, now.Add(d.cfg.PressureInterval)
	pctx, cancel := context.WithTimeout(ctx, d.transferTimeout())
	ps, err := d.cfg.Pressure.Pressure(pctx, now)
	cancel()
	if err != nil {
		d.log.Warn("rebalancer: pressure read failed", "err", err)
		d.observeTransfer(TransferInfo{Kind: PressureFailed, Err: err})
		return
	}
	d.setStatus(func(s *Status) { s.Transfers.LastPressure, s.Transfers.PressureKeys = now, len(ps) })
	// Every read is passed on, an empty one too: a key is under pressure
	// until a read no longer lists it (a region whose traffic just left
	// gives at the next ask).
	ask := d.core.Pressure(now, ps)
	if len(ps) > 0 || ask != nil {
		d.log.Debug("rebalancer: pressure read", "keys", len(ps), "asked", askLen(ask))
	}
	if ask != nil && len(ask.Keys) > 0 {
		d.publish(tr, transferPublish{ask: ask, info: TransferInfo{Kind: AskSent, Keys: len(ask.Keys)}})
	}
}

// reask asks again for what the last pressure read asked for when it is
// still missing (Core.Reask), half an ask interval after that ask: a
// giver's refusal is not sent, so the asker cannot wait for one.
func (d *Driver) reask(tr *transferLoop, now time.Time) {
	ask := d.core.Reask(now)
	if ask == nil || len(ask.Keys) == 0 {
		return
	}
	d.log.Debug("rebalancer: pressure re-ask", "keys", len(ask.Keys))
	d.publish(tr, transferPublish{ask: ask, info: TransferInfo{Kind: AskSent, Keys: len(ask.Keys)}})
}

// reaskDue reports whether Core.Reask is due at now.
func (d *Driver) reaskDue(tr *transferLoop, now time.Time) bool {
	at := d.core.ReaskAt()
	return tr.in != nil && !at.IsZero() && !now.Before(at)
}

// applyTransfer handles one message of the transfer bus.
func (d *Driver) applyTransfer(ctx context.Context, tr *transferLoop, m transferIn) {
	region := d.core.Config().Region
	switch {
	case m.ask != nil && m.ask.Region != region:
		d.answerAsk(ctx, tr, m.ask)
	case m.give != nil && m.give.To == region:
		d.acceptGive(ctx, m.give)
	}
}

// answerAsk reads this region's demand for the asked keys, lets the Core
// answer, writes the lowered shares and only then publishes the give (in
// the background: see publish).
func (d *Driver) answerAsk(ctx context.Context, tr *transferLoop, ask *Ask) {
	keys := make([]Key, len(ask.Keys))
	for i, k := range ask.Keys {
		keys[i] = k.Key
	}
	now := d.clock.Now()
	rctx, cancel := context.WithTimeout(ctx, d.transferTimeout())
	own, err := d.cfg.Pressure.Demand(rctx, now, keys)
	cancel()
	info := TransferInfo{Kind: AskReceived, Region: ask.Region, Keys: len(ask.Keys)}
	if err != nil {
		// Without its own demand this region cannot tell its spare: it
		// gives nothing (the asker asks again).
		info.Err = fmt.Errorf("rebalancer: ask of %s not answered: own demand unread: %w", ask.Region, err)
		d.log.Warn("rebalancer: ask not answered", "err", info.Err)
		d.observeTransfer(info)
		return
	}
	now = d.clock.Now()
	ups, give, err := d.core.ReceiveAsk(now, ask, own)
	if err != nil {
		info.Err = err
		d.log.Warn("rebalancer: ask rejected", "from", ask.Region, "err", err)
		d.observeTransfer(info)
		return
	}
	d.observeTransfer(info)
	d.log.Debug("rebalancer: ask answered", "from", ask.Region, "epoch", ask.Epoch, "keys", len(ask.Keys), "own_keys", len(own),
		"own_demand_milli", firstDemand(own, ask), "gave_keys", giveLen(give))
	if give == nil || len(give.Keys) == 0 {
		d.enqueue(ups)
		if len(ups) > 0 {
			_ = d.flush(ctx)
		}
		return
	}
	gi := TransferInfo{Kind: GiveSent, Region: give.To, Keys: len(give.Keys), Amount: amountOf(give)}
	// The lowered shares first: the give may only leave once no gateway
	// enforces them any more. A failed write keeps them queued (retried;
	// no report meanwhile) and drops the give.
	d.enqueue(ups)
	if err := d.flush(ctx); err != nil {
		gi.Reason, gi.Err = ReasonWrite, fmt.Errorf("rebalancer: give %d to %s dropped: lowered shares unwritten: %w", give.ID, give.To, err)
		d.log.Warn("rebalancer: give dropped", "err", gi.Err)
		d.observeTransfer(gi)
		return
	}
	d.publish(tr, transferPublish{give: give, info: gi})
}

// acceptGive lets the Core apply a give to this region and writes the
// raised shares (on failure they stay queued, and no report is published
// until they are written). A refusal is logged at debug level with its
// reason, the giver, the give's id and transfer epoch, this region's last
// collected epoch and the give's keys (the first logGiveKeys of them).
func (d *Driver) acceptGive(ctx context.Context, g *Give) {
	ups, why, err := d.core.ReceiveGiveReason(d.clock.Now(), g)
	info := TransferInfo{Kind: GiveReceived, Region: g.From, Keys: len(g.Keys), Amount: amountOf(g), Refusal: why}
	switch {
	case err != nil:
		info.Reason, info.Err = ReasonError, err
		d.log.Warn("rebalancer: give rejected", "reason", why.String(), "from", g.From, "id", g.ID, "err", err)
	case why != GiveAccepted:
		info.Reason = ReasonCore
		if d.log.Enabled(ctx, slog.LevelDebug) {
			collected, _ := d.core.Pending()
			d.log.Debug("rebalancer: give refused", "reason", why.String(), "from", g.From, "id", g.ID,
				"transfer_epoch", g.Transfer, "collected_epoch", collected, "keys", len(g.Keys), "key", giveKeys(g))
		}
	default:
		info.Accepted = true
		d.enqueue(ups)
		if werr := d.flush(ctx); werr != nil {
			info.Err = fmt.Errorf("rebalancer: accepted give %d of %s: raised shares unwritten (retried): %w", g.ID, g.From, werr)
		} else {
			d.log.Debug("rebalancer: give accepted and written", "from", g.From, "id", g.ID, "keys", len(g.Keys), "rate_milli", info.Amount.RateMilli)
		}
	}
	d.observeTransfer(info)
}

// firstDemand is the demand in ps of ask's first key (0 when absent).
func firstDemand(ps []Pressure, ask *Ask) int64 {
	if len(ask.Keys) == 0 {
		return 0
	}
	for _, p := range ps {
		if p.Key == ask.Keys[0].Key {
			return p.DemandMilli
		}
	}
	return 0
}

func askLen(a *Ask) int {
	if a == nil {
		return 0
	}
	return len(a.Keys)
}

func giveLen(g *Give) int {
	if g == nil {
		return 0
	}
	return len(g.Keys)
}

// logGiveKeys bounds the keys a refused give's log line names.
const logGiveKeys = 8

// giveKeys names the first logGiveKeys keys of g as policy/subject.
func giveKeys(g *Give) []string {
	out := make([]string, 0, min(len(g.Keys), logGiveKeys))
	for _, k := range g.Keys[:min(len(g.Keys), logGiveKeys)] {
		out = append(out, k.PolicyID+"/"+k.Subject)
	}
	return out
}

func amountOf(g *Give) shares.Share {
	var s shares.Share
	for _, k := range g.Keys {
		s.RateMilli += k.Amount.RateMilli
		s.BurstMilli += k.Amount.BurstMilli
	}
	return s
}

// errNoTransfers is returned by validateTransfers for half a setup.
var errNoTransfers = errors.New("set both or neither")

// validateTransfers checks the transfer fields of cfg and fills their
// defaults.
func validateTransfers(cfg *DriverConfig) error {
	if (cfg.Pressure == nil) != (cfg.Transfers == nil) {
		return fmt.Errorf("%w: driver: Pressure and Transfers: %w", ErrConfig, errNoTransfers)
	}
	if cfg.PressureInterval == 0 {
		cfg.PressureInterval = DefaultPressureInterval
	}
	if cfg.PressureInterval < 0 {
		return fmt.Errorf("%w: driver: PressureInterval %v is negative", ErrConfig, cfg.PressureInterval)
	}
	return nil
}
