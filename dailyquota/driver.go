package dailyquota

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// PolicySubject names one replicated window state: a policy and a subject
// (the limiter's encoded subject).
type PolicySubject struct {
	Policy  string
	Subject string
}

// Stored is a replicated window as this region's store holds it.
type Stored struct {
	StartMs int64            // window start, Unix ms; 0 when there is none
	Counts  map[string]int64 // region -> admitted cost units
	Cap     int64            // this region's cap, -1 when none
}

// CapUpdate sets (Cap >= 0) or removes (Cap < 0) this region's cap in one
// window.
type CapUpdate struct {
	PolicySubject
	StartMs  int64
	WindowMs int64
	Cap      int64
}

// Store is this region's store of replicated windows (the limiter's Redis;
// dailyquota/redisio adapts limiter.RedisStore). Implementations must be
// safe for concurrent use and honour ctx.
type Store interface {
	// Read returns the stored state of each key, in the order of keys. An
	// error means nothing was read. The caller owns the result.
	Read(ctx context.Context, keys []PolicySubject) ([]Stored, error)
	// Merge max-merges each count into its window (see
	// limiter.RedisStore.MergeWindowCount). It returns the counts it could
	// not apply, which the caller retries, and why.
	Merge(ctx context.Context, counts []Count) (failed []Count, err error)
	// SetCaps applies cap updates; it returns those that failed and why.
	SetCaps(ctx context.Context, caps []CapUpdate) (failed []CapUpdate, err error)
}

// ActiveKeys finds the keys whose windows this region's gateways recently
// admitted on (dailyquota/redisio reads the gateways' usage counts), so the
// driver need not scan the store. An error means none were found this time;
// the driver keeps watching the keys it already knows.
type ActiveKeys interface {
	Active(ctx context.Context, now time.Time) ([]PolicySubject, error)
}

// Bus carries counts between regions (dailyquota/kafkarepl over Kafka).
type Bus interface {
	// Publish sends counts and blocks until they are durably accepted, or
	// fails; on failure any of them may or may not have been sent (max-merge
	// makes resending safe). The caller keeps counts.
	Publish(ctx context.Context, counts []Count) error
	// Run delivers every region's counts (this region's too), in any order,
	// at least once, one call at a time, until ctx ends (it then returns
	// ctx.Err()) or it fails. deliver must return quickly.
	Run(ctx context.Context, deliver func(Count)) error
}

// Clock is the driver's time source; nil in DriverConfig means real time.
type Clock interface {
	Now() time.Time
	// NewTimer returns a channel that receives once, d from now, and a
	// function that stops the timer.
	NewTimer(d time.Duration) (<-chan time.Time, func() bool)
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) NewTimer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// DriverConfig configures a Driver. Start from DefaultDriverConfig.
type DriverConfig struct {
	// Region is this region's name (limiter.Config.Region). Required.
	Region string
	// Regions lists every region sharing the policies (this one included);
	// the remainder split gives each a part. Required.
	Regions []string
	// Policies are the global fixed-window policies to replicate. Required.
	Policies []Policy
	// Interval between publish passes. Default 1 s (issue 6: changed counts
	// are published at least every second).
	Interval time.Duration
	// WatchFor is how long a key stays watched (its count read every pass)
	// after ActiveKeys last returned it. Default 30 s: three usage epochs,
	// covering late usage flushes.
	WatchFor time.Duration
	// Grace: a received count is merged until its window has been over
	// this long (clock skew between regions). Default 1 s.
	Grace time.Duration
	// RetryInterval: how long Run waits before restarting a failed Bus.Run.
	// Default 1 s.
	RetryInterval time.Duration
	// Publisher tunes the refresh of unchanged counts (its Region is set
	// from Region).
	Publisher PublisherConfig
	// Split configures the remainder split; NoSplit turns it off (no caps
	// are ever set, and caps found are left alone).
	Split   SplitConfig
	NoSplit bool
	// Clock; nil means real time.
	Clock Clock
	// Logger; nil discards.
	Logger *slog.Logger
}

// DefaultDriverConfig returns the defaults for region among regions.
func DefaultDriverConfig(region string, regions []string, policies []Policy) DriverConfig {
	return DriverConfig{
		Region: region, Regions: regions, Policies: policies,
		Interval: time.Second, WatchFor: 30 * time.Second, Grace: time.Second, RetryInterval: time.Second,
		Publisher: DefaultPublisherConfig(region), Split: DefaultSplitConfig(),
	}
}

// Validate fills defaults and rejects bad values, naming the field.
func (c *DriverConfig) Validate() error {
	d := DefaultDriverConfig(c.Region, c.Regions, c.Policies)
	if !namePattern.MatchString(c.Region) {
		return fmt.Errorf("%w: driver: region %q: want 1 to 64 of [A-Za-z0-9._-]", ErrInvalid, c.Region)
	}
	if !slices.Contains(c.Regions, c.Region) {
		return fmt.Errorf("%w: driver: regions %v must include this region %q", ErrInvalid, c.Regions, c.Region)
	}
	for i, r := range c.Regions {
		if !namePattern.MatchString(r) {
			return fmt.Errorf("%w: driver: regions[%d] %q: want 1 to 64 of [A-Za-z0-9._-]", ErrInvalid, i, r)
		}
	}
	if len(c.Policies) == 0 {
		return fmt.Errorf("%w: driver: policies: at least one global fixed-window policy is required", ErrInvalid)
	}
	seen := map[string]bool{}
	for i, p := range c.Policies {
		if err := p.Validate(); err != nil {
			return fmt.Errorf("driver: policies[%d]: %w", i, err)
		}
		if seen[p.ID] {
			return fmt.Errorf("%w: driver: policies[%d]: duplicate id %q", ErrInvalid, i, p.ID)
		}
		seen[p.ID] = true
	}
	for _, f := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"interval", &c.Interval, d.Interval}, {"watch for", &c.WatchFor, d.WatchFor},
		{"grace", &c.Grace, d.Grace}, {"retry interval", &c.RetryInterval, d.RetryInterval},
	} {
		if *f.v == 0 {
			*f.v = f.def
		}
		if *f.v < 0 {
			return fmt.Errorf("%w: driver: %s %v: must not be negative", ErrInvalid, f.name, *f.v)
		}
	}
	c.Publisher.Region = c.Region
	if err := c.Publisher.Validate(); err != nil {
		return err
	}
	if err := c.Split.Validate(); err != nil {
		return err
	}
	if c.Clock == nil {
		c.Clock = systemClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}

// Stats counts what a Driver did since NewDriver.
type Stats struct {
	Passes          int64 // publish passes run
	Published       int64 // counts the bus acknowledged
	PublishFailures int64 // failed Publish calls
	Received        int64 // counts delivered by the bus
	Merged          int64 // counts merged into the store
	Expired         int64 // received counts of ended windows, dropped
	Invalid         int64 // received counts rejected by Accept (malformed, unknown policy)
	MergeFailures   int64 // failed merges (retried next pass)
	CapsSet         int64 // cap updates applied
	LagMaxMs        int64 // largest (receive time - sender's UpdatedMs), other regions' counts
	LagSumMs        int64 // sum of those lags, for the mean
	LagN            int64 // number of those lags
}

// Driver runs replication for one region: every Interval it reads this
// region's counts of recently active keys, publishes those that changed
// (Publisher), retries failed merges and applies the remainder-split caps;
// meanwhile it merges every count the bus delivers. Construct with
// NewDriver; Run owns the goroutines. Stats is safe for concurrent use.
type Driver struct {
	cfg      DriverConfig
	store    Store
	active   ActiveKeys
	bus      Bus
	pub      *Publisher
	policies map[string]Policy

	mu      sync.Mutex // guards the fields below
	watch   map[PolicySubject]int64
	touched map[PolicySubject]bool
	retry   map[Key]Count
	basis   map[PolicySubject]capBasis

	stats struct {
		passes, published, publishFailures, received, merged, expired, invalid atomic.Int64
		mergeFailures, capsSet, lagMax, lagSum, lagN                           atomic.Int64
	}
}

// capBasis is what this region's cap of one window was computed from: the
// other regions' counts. The cap is recomputed only when they change (or
// when there is none): recomputing on this region's own growth would hand
// this region a new part of a remainder that only it is spending, and a
// region cut off from the others would creep up to the whole remainder.
type capBasis struct {
	startMs, endMs int64
	others         int64 // Σ of the other regions' counts
}

// NewDriver returns a Driver. It does no I/O.
func NewDriver(cfg DriverConfig, store Store, active ActiveKeys, bus Bus) (*Driver, error) {
	if store == nil || active == nil || bus == nil {
		return nil, fmt.Errorf("%w: driver: store, active keys and bus are required", ErrInvalid)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	pub, err := NewPublisher(cfg.Publisher)
	if err != nil {
		return nil, err
	}
	pols := make(map[string]Policy, len(cfg.Policies))
	for _, p := range cfg.Policies {
		pols[p.ID] = p
	}
	return &Driver{
		cfg: cfg, store: store, active: active, bus: bus, pub: pub, policies: pols,
		watch: map[PolicySubject]int64{}, touched: map[PolicySubject]bool{}, retry: map[Key]Count{},
		basis: map[PolicySubject]capBasis{},
	}, nil
}

// Stats returns a snapshot of the counters.
func (d *Driver) Stats() Stats {
	s := &d.stats
	return Stats{
		Passes: s.passes.Load(), Published: s.published.Load(), PublishFailures: s.publishFailures.Load(),
		Received: s.received.Load(), Merged: s.merged.Load(), Expired: s.expired.Load(), Invalid: s.invalid.Load(),
		MergeFailures: s.mergeFailures.Load(), CapsSet: s.capsSet.Load(),
		LagMaxMs: s.lagMax.Load(), LagSumMs: s.lagSum.Load(), LagN: s.lagN.Load(),
	}
}

// Run replicates until ctx ends, then returns ctx.Err(). A failing bus
// consumer is restarted after RetryInterval; a failing pass is logged and
// the next pass tries again (nothing is lost: unacknowledged counts and
// failed merges are retried).
func (d *Driver) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		d.consume(ctx)
	}()
	defer wg.Wait()
	for {
		if err := d.Pass(ctx); err != nil && ctx.Err() == nil {
			d.cfg.Logger.Warn("dailyquota: pass failed", "err", err)
		}
		c, stop := d.cfg.Clock.NewTimer(d.cfg.Interval)
		select {
		case <-ctx.Done():
			stop()
			return ctx.Err()
		case <-c:
		}
	}
}

func (d *Driver) consume(ctx context.Context) {
	for {
		err := d.bus.Run(ctx, d.Deliver)
		if ctx.Err() != nil {
			return
		}
		d.cfg.Logger.Warn("dailyquota: consumer stopped; restarting", "err", err)
		c, stop := d.cfg.Clock.NewTimer(d.cfg.RetryInterval)
		select {
		case <-ctx.Done():
			stop()
			return
		case <-c:
		}
	}
}

// Deliver applies one received count: Accept, then merge into the store
// (a failed merge is kept and retried by the next pass). Run calls it for
// every count the bus delivers; tests may call it directly.
func (d *Driver) Deliver(c Count) {
	now := d.cfg.Clock.Now()
	d.stats.received.Add(1)
	switch err := Accept(now, c, d.policies, d.cfg.Grace); {
	case errors.Is(err, ErrExpired):
		d.stats.expired.Add(1)
		return
	case err != nil:
		d.stats.invalid.Add(1)
		return
	}
	if c.Region != d.cfg.Region && c.UpdatedMs > 0 {
		lag := max(0, now.UnixMilli()-c.UpdatedMs)
		d.stats.lagSum.Add(lag)
		d.stats.lagN.Add(1)
		for {
			m := d.stats.lagMax.Load()
			if lag <= m || d.stats.lagMax.CompareAndSwap(m, lag) {
				break
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	failed, _ := d.store.Merge(ctx, []Count{c})
	d.mu.Lock()
	defer d.mu.Unlock()
	d.touched[PolicySubject{c.Policy, c.Subject}] = true
	if len(failed) > 0 {
		d.stats.mergeFailures.Add(1)
		d.keepRetry(c)
		return
	}
	d.stats.merged.Add(1)
}

// keepRetry remembers c for the next pass (the larger count per key); the
// caller holds d.mu.
func (d *Driver) keepRetry(c Count) {
	if cur, ok := d.retry[c.Key]; !ok || c.N > cur.N {
		d.retry[c.Key] = c
	}
}

// Pass runs one publish pass at the clock's now: find active keys, read
// the watched keys' windows, publish this region's changed counts, retry
// failed merges and apply caps. Run calls it every Interval; tests may
// call it directly. It returns the first error met; the rest of the pass
// still runs.
func (d *Driver) Pass(ctx context.Context) error {
	now := d.cfg.Clock.Now()
	nowMs := now.UnixMilli()
	d.stats.passes.Add(1)
	var errs []error
	active, err := d.active.Active(ctx, now)
	if err != nil {
		errs = append(errs, fmt.Errorf("dailyquota: active keys: %w", err))
	}

	d.mu.Lock()
	for _, k := range active {
		if _, ok := d.policies[k.Policy]; ok {
			d.watch[k] = nowMs
		}
	}
	for k, seen := range d.watch {
		if nowMs-seen > d.cfg.WatchFor.Milliseconds() {
			delete(d.watch, k)
		}
	}
	keySet := map[PolicySubject]bool{}
	for k := range d.watch {
		keySet[k] = true
	}
	for k := range d.touched {
		keySet[k] = true
	}
	d.touched = map[PolicySubject]bool{}
	for k, b := range d.basis {
		if b.endMs <= nowMs {
			delete(d.basis, k)
		}
	}
	retry := make([]Count, 0, len(d.retry))
	for k, c := range d.retry {
		retry = append(retry, c)
		delete(d.retry, k)
	}
	d.mu.Unlock()

	// Retry merges that failed.
	var live []Count
	for _, c := range retry {
		if Accept(now, c, d.policies, d.cfg.Grace) == nil {
			live = append(live, c)
		}
	}
	if len(live) > 0 {
		failed, err := d.store.Merge(ctx, live)
		d.stats.merged.Add(int64(len(live) - len(failed)))
		if err != nil {
			errs = append(errs, fmt.Errorf("dailyquota: merge: %w", err))
		}
		d.mu.Lock()
		for _, c := range failed {
			d.keepRetry(c)
		}
		d.mu.Unlock()
	}

	keys := make([]PolicySubject, 0, len(keySet))
	for k := range keySet {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Policy != keys[j].Policy {
			return keys[i].Policy < keys[j].Policy
		}
		return keys[i].Subject < keys[j].Subject
	})
	var stored []Stored
	if len(keys) > 0 {
		stored, err = d.store.Read(ctx, keys)
		if err != nil {
			errs = append(errs, fmt.Errorf("dailyquota: read windows: %w", err))
			keys, stored = nil, nil
		}
	}
	var observed []Count
	var caps []CapUpdate
	for i, k := range keys {
		st := stored[i]
		p := d.policies[k.Policy]
		if st.StartMs == 0 {
			continue
		}
		w := p.Window.At(time.UnixMilli(st.StartMs))
		if w.StartMs != st.StartMs || w.EndMs <= nowMs {
			continue // not a window of this policy, or over
		}
		if n, ok := st.Counts[d.cfg.Region]; ok {
			observed = append(observed, Count{Key: Key{Subject: k.Subject, Policy: k.Policy, StartMs: st.StartMs, Region: d.cfg.Region}, WindowMs: w.LengthMs(), N: n})
		}
		if d.cfg.NoSplit {
			continue
		}
		var others int64
		for r, n := range st.Counts {
			if r != d.cfg.Region {
				others += n
			}
		}
		b := capBasis{startMs: st.StartMs, endMs: w.EndMs, others: others}
		d.mu.Lock()
		prev, had := d.basis[k]
		d.mu.Unlock()
		if st.Cap >= 0 && had && prev == b {
			continue // nothing new from the other regions: keep the cap
		}
		want := int64(-1)
		if cs := Caps(p.Limit, d.cfg.Regions, st.Counts, d.cfg.Split); cs != nil {
			want = cs[d.cfg.Region]
		}
		if want >= 0 {
			d.mu.Lock()
			d.basis[k] = b
			d.mu.Unlock()
		}
		if want != st.Cap {
			caps = append(caps, CapUpdate{PolicySubject: k, StartMs: st.StartMs, WindowMs: w.LengthMs(), Cap: want})
		}
	}

	if pending := d.pub.Pending(now, observed); len(pending) > 0 {
		if err := d.bus.Publish(ctx, pending); err != nil {
			d.stats.publishFailures.Add(1)
			errs = append(errs, fmt.Errorf("dailyquota: publish %d counts: %w", len(pending), err))
		} else {
			d.pub.Acked(now, pending)
			d.stats.published.Add(int64(len(pending)))
		}
	}
	if len(caps) > 0 {
		failed, err := d.store.SetCaps(ctx, caps)
		d.stats.capsSet.Add(int64(len(caps) - len(failed)))
		if err != nil {
			errs = append(errs, fmt.Errorf("dailyquota: set caps: %w", err))
		}
		// Failed caps are recomputed next pass: mark their keys touched.
		d.mu.Lock()
		for _, c := range failed {
			d.touched[c.PolicySubject] = true
			delete(d.basis, c.PolicySubject)
		}
		d.mu.Unlock()
	}
	return errors.Join(errs...)
}
