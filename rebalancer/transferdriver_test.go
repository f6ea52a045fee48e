package rebalancer

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/shares"
)

var (
	_ TransferBus    = (*memTransfers)(nil)
	_ PressureSource = (*fakePressure)(nil)
)

// memTransfers is one region's port on an in-memory transfer bus: every
// ask and give reaches every region (its own too) after 5 ms.
type memTransfers struct {
	w      *world
	region string
	inbox  chan transferIn
	all    map[string]*memTransfers

	mu    sync.Mutex
	gives []*Give // published by this region
	fail  bool    // publications fail
	// delay is how long each publication waits for its acknowledgement
	// (a far broker); one whose context ends first fails with its error.
	delay time.Duration
}

// ack waits m.delay, or fails with ctx's error when it ends first.
func (m *memTransfers) ack(ctx context.Context) error { return awaitAck(ctx, m.delay) }

func (m *memTransfers) send(in transferIn) {
	for _, p := range m.all {
		time.AfterFunc(5*time.Millisecond, func() { p.inbox <- in })
	}
}

func (m *memTransfers) PublishAsk(ctx context.Context, a *Ask) error {
	if err := m.ack(ctx); err != nil {
		return err
	}
	c := *a
	m.send(transferIn{ask: &c})
	return nil
}

func (m *memTransfers) PublishGive(ctx context.Context, g *Give) error {
	if err := m.ack(ctx); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return errors.New("fake: transfer bus unavailable")
	}
	c := *g
	m.gives = append(m.gives, &c)
	m.send(transferIn{give: &c})
	return nil
}

func (m *memTransfers) published() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.gives)
}

func (m *memTransfers) ReceiveTransfer(ctx context.Context) (*Ask, *Give, error) {
	select {
	case in := <-m.inbox:
		return in.ask, in.give, nil
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}

// fakePressure reads the world's demand (per epoch) as the rate.
type fakePressure struct {
	w      *world
	region string
	epoch  time.Duration
}

func (p *fakePressure) rate(now time.Time, k Key) int64 {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	return p.w.demand(p.region, EpochOf(now, p.epoch), k) * 1_000_000 / p.epoch.Milliseconds()
}

// Pressure returns the keys whose demand is above the enforced share (the
// gateways reject some of it).
func (p *fakePressure) Pressure(_ context.Context, now time.Time) ([]Pressure, error) {
	var out []Pressure
	for _, k := range p.w.keys {
		d := p.rate(now, k)
		p.w.mu.Lock()
		share := p.w.enforcedLocked(p.region, k, now)
		p.w.mu.Unlock()
		if d > share.RateMilli {
			out = append(out, Pressure{Key: k, DemandMilli: d})
		}
	}
	return out, nil
}

func (p *fakePressure) Demand(_ context.Context, now time.Time, keys []Key) ([]Pressure, error) {
	var out []Pressure
	for _, k := range keys {
		out = append(out, Pressure{Key: k, DemandMilli: p.rate(now, k)})
	}
	return out, nil
}

// transferLog records the transfers a driver reports.
type transferLog struct {
	observerLog
	tmu   sync.Mutex
	infos []TransferInfo
}

func (l *transferLog) Transferred(t TransferInfo) {
	l.tmu.Lock()
	defer l.tmu.Unlock()
	l.infos = append(l.infos, t)
}

// failed counts the transfers of kind that reported an error.
func (l *transferLog) failed(kind TransferKind) int {
	l.tmu.Lock()
	defer l.tmu.Unlock()
	n := 0
	for _, t := range l.infos {
		if t.Kind == kind && t.Err != nil {
			n++
		}
	}
	return n
}

func (l *transferLog) count(kind TransferKind, reason string) int {
	l.tmu.Lock()
	defer l.tmu.Unlock()
	n := 0
	for _, t := range l.infos {
		if t.Kind == kind && t.Reason == reason {
			n++
		}
	}
	return n
}

// transferRig is two or more Drivers with transfers over memTransfers
// (each publication acknowledged after delay), MaxWait 1 s, pressure read
// every 200 ms (startTransferRig) or every interval
// (startTransferRigEvery) from pressure(region).
type transferRig struct {
	all     map[string]*memTransfers
	logs    map[string]*transferLog
	drivers map[string]*Driver
}

func startTransferRig(t *testing.T, ctx context.Context, w *world, epoch, delay time.Duration, pressure func(region string) PressureSource) transferRig {
	return startTransferRigEvery(t, ctx, w, epoch, delay, 200*time.Millisecond, pressure)
}

func startTransferRigEvery(t *testing.T, ctx context.Context, w *world, epoch, delay, interval time.Duration, pressure func(region string) PressureSource) transferRig {
	rig := transferRig{all: map[string]*memTransfers{}, logs: map[string]*transferLog{}, drivers: map[string]*Driver{}}
	for _, name := range w.regions {
		rig.all[name] = &memTransfers{w: w, region: name, inbox: make(chan transferIn, 1024), all: rig.all, delay: delay}
	}
	for _, name := range w.regions {
		cfg := driverTestConfig()
		cfg.Region, cfg.Regions, cfg.Epoch, cfg.MaxWait = name, w.regions, epoch, time.Second
		core, err := New(cfg, PolicyMap{"p": w.lim})
		require.NoError(t, err)
		rig.logs[name] = &transferLog{}
		d, err := NewDriver(core, DriverConfig{
			Usage: &fakeSource{w: w, region: name}, Shares: &fakeSink{w: w, region: name}, Bus: w.ports[name],
			Observer: rig.logs[name], Pressure: pressure(name), Transfers: rig.all[name],
			PressureInterval: interval,
		})
		require.NoError(t, err)
		rig.drivers[name] = d
		go func() { assert.ErrorIs(t, d.Run(ctx), context.Canceled) }()
	}
	return rig
}

// TestDriverGiveWaitsForItsWrite: a giver whose share writes fail
// publishes no give (the lowered shares are not enforced yet), and a give
// that cannot be published is counted and never reaches the asker; once both work,
// gives flow and the asker grows within the epoch of the shift (4 s
// epochs: no decision grows it meanwhile). The enforced sum is checked
// after every write and every 50 ms.
func TestDriverGiveWaitsForItsWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const epoch = 4 * time.Second
		lim := shares.Limit{RateMilli: 300_000, BurstMilli: 300_000, Regions: 2}
		keys := []Key{{PolicyID: "p", Subject: "k:a"}}
		w := newWorld(t, []string{"eu", "us"}, lim, keys)
		// busy: all the demand in region at from epoch m on, before it in
		// region was (the usage of an epoch is what it had).
		busy := func(was, at string, m int64) func(string, int64, Key) int64 {
			return func(region string, e int64, _ Key) int64 {
				if e >= m && region == at || e < m && region == was {
					return 4000 // 1000/s
				}
				return 0
			}
		}
		w.demand = busy("eu", "eu", 0)
		ctx, cancel := context.WithCancel(t.Context())
		rig := startTransferRig(t, ctx, w, epoch, 0, func(name string) PressureSource {
			return &fakePressure{w: w, region: name, epoch: epoch}
		})
		all, logs := rig.all, rig.logs
		// shift moves the demand to region at 100 ms into the next epoch
		// (that epoch's usage is at's), with mutate applied first.
		where := "eu"
		shift := func(at string, mutate func()) {
			m := EpochOf(time.Now(), epoch) + 1
			time.Sleep(time.Until(EpochStart(m, epoch).Add(100 * time.Millisecond)))
			w.mu.Lock()
			mutate()
			w.demand = busy(where, at, m)
			w.mu.Unlock()
			where = at
		}
		w.watch(12*epoch, keys[0])
		require.Greater(t, w.enforced("eu", keys[0]).RateMilli, lim.RateMilli*9/10, "eu holds most of L")

		// The demand moves to us while eu cannot write: eu answers us's
		// asks but publishes no give.
		before := all["eu"].published()
		shift("us", func() { w.writeFail["eu"] = true })
		w.watch(epoch-500*time.Millisecond, keys[0])
		assert.Equal(t, before, all["eu"].published(), "no give while its lowered shares are unwritten")
		assert.Positive(t, logs["eu"].count(GiveSent, ReasonWrite), "gives dropped for the write")
		assert.LessOrEqual(t, w.enforced("us", keys[0]).RateMilli, lim.Default().RateMilli, "us got nothing within the epoch")

		// Back to eu; then the shift again with eu's publications failing.
		shift("eu", func() { w.writeFail["eu"] = false })
		w.watch(4*epoch, keys[0])
		require.Greater(t, w.enforced("eu", keys[0]).RateMilli, lim.RateMilli*9/10, "eu holds most of L again")
		shift("us", func() { all["eu"].fail = true })
		w.watch(epoch-500*time.Millisecond, keys[0])
		// (The lowered share is in eu's next report, so the next decision
		// may hand it out: the epoch path, not a gift.)
		assert.Positive(t, logs["eu"].count(GiveSent, ReasonPublish), "gives not published")
		assert.Zero(t, logs["us"].count(GiveReceived, ""), "us accepted no give")

		// Both work: us gets its share from gives within the epoch.
		shift("eu", func() { all["eu"].fail = false })
		w.watch(4*epoch, keys[0])
		require.Greater(t, w.enforced("eu", keys[0]).RateMilli, lim.RateMilli*9/10, "eu holds most of L again")
		shift("us", func() {})
		w.watch(epoch-500*time.Millisecond, keys[0])
		assert.Greater(t, w.enforced("us", keys[0]).RateMilli, lim.RateMilli*9/10, "us holds most of L within the epoch")
		assert.Positive(t, logs["us"].count(GiveReceived, ""), "us accepted gives")
		t.Logf("eu: %d gives published, %d dropped for the write, %d not published; %d sum checks",
			all["eu"].published(), logs["eu"].count(GiveSent, ReasonWrite), logs["eu"].count(GiveSent, ReasonPublish), w.checks)
		cancel()
		synctest.Wait()
	})
}

// shiftWorld is a world of two regions, eu and us, sharing one key (L =
// B = 300/s) whose demand, 1000/s, is all in eu until moveTo(m) moves it
// to us from epoch m on.
func shiftWorld(t *testing.T) (w *world, lim shares.Limit, keys []Key, moveTo func(m int64)) {
	lim = shares.Limit{RateMilli: 300_000, BurstMilli: 300_000, Regions: 2}
	keys = []Key{{PolicyID: "p", Subject: "k:a"}}
	w = newWorld(t, []string{"eu", "us"}, lim, keys)
	busyFrom := int64(math.MaxInt64) // the epoch from which us has the demand
	w.demand = func(region string, e int64, _ Key) int64 {
		if (e >= busyFrom) == (region == "us") {
			return 4000 // 1000/s
		}
		return 0
	}
	return w, lim, keys, func(m int64) {
		w.mu.Lock()
		defer w.mu.Unlock()
		busyFrom = m
	}
}

// TestDriverSlowTransferBus: every ask, give and report takes 1 s to be
// acknowledged (a far broker: twice the 500 ms bound transfer
// publications had, within IOTimeout, Epoch/2), as in the deployed
// abrupt-shift-late-reports run, where no ask got through and each
// report's publication held the pressure reads. They are still published
// (in the background), the asker grows within the epoch of the shift, and
// the epoch loop collects every epoch on time meanwhile.
func TestDriverSlowTransferBus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const epoch = 4 * time.Second
		w, lim, keys, moveTo := shiftWorld(t)
		w.ackDelay = time.Second
		ctx, cancel := context.WithCancel(t.Context())
		pressure := map[string]*wakingPressure{}
		for _, name := range w.regions {
			// Never woken: it records the reads, one every PressureInterval.
			pressure[name] = &wakingPressure{fakePressure: &fakePressure{w: w, region: name, epoch: epoch}, wake: make(chan struct{})}
		}
		rig := startTransferRig(t, ctx, w, epoch, time.Second, func(name string) PressureSource { return pressure[name] })
		all, logs, drivers := rig.all, rig.logs, rig.drivers
		w.watch(12*epoch, keys[0])
		require.Greater(t, w.enforced("eu", keys[0]).RateMilli, lim.RateMilli*9/10, "eu holds most of L")

		m := EpochOf(time.Now(), epoch) + 1
		time.Sleep(time.Until(EpochStart(m, epoch).Add(100 * time.Millisecond)))
		moveTo(m)
		w.watch(epoch-500*time.Millisecond, keys[0])
		assert.Greater(t, w.enforced("us", keys[0]).RateMilli, lim.RateMilli*9/10, "us holds most of L within the epoch")
		assert.Positive(t, logs["us"].count(GiveReceived, ""), "us accepted gives")
		assert.Positive(t, all["eu"].published(), "eu published gives")
		assert.Zero(t, logs["eu"].failed(GiveSent), "no give failed")
		for name, p := range pressure {
			// No collection, report or give held a pressure read.
			reads := p.readsSince(time.Now().Add(-3 * epoch))
			gap := time.Duration(0)
			for i := 1; i < len(reads); i++ {
				gap = max(gap, reads[i]-reads[i-1])
			}
			assert.LessOrEqual(t, gap, 250*time.Millisecond, "%s: longest time between pressure reads", name)
		}
		for name, d := range drivers {
			// Collected at CollectDelay after each epoch ended: the last
			// one ended 3.4 s ago.
			st := d.Status()
			assert.Equal(t, EpochOf(time.Now(), epoch)-1, st.LastEpoch, "%s collected the last epoch on time", name)
			assert.Equal(t, st.LastCollect.Add(time.Second), st.LastPublish, "%s published its report, acknowledged after 1 s", name)
		}
		t.Logf("us: %d asks sent (%d failed); eu: %d gives published", logs["us"].count(AskSent, ""), logs["us"].failed(AskSent), all["eu"].published())
		cancel()
		synctest.Wait()
	})
}

// wakingPressure is a fakePressure that is also a PressureWaker: a
// send on wake wakes the driver; it records the times of its reads.
type wakingPressure struct {
	*fakePressure
	wake  chan struct{}
	mu    sync.Mutex
	reads []time.Time
}

var _ PressureWaker = (*wakingPressure)(nil)

func (p *wakingPressure) Pressure(ctx context.Context, now time.Time) ([]Pressure, error) {
	out, err := p.fakePressure.Pressure(ctx, now)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reads = append(p.reads, now)
	return out, err
}

func (p *wakingPressure) WaitPressure(ctx context.Context, wait time.Duration) (bool, error) {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-p.wake:
		return true, nil
	case <-t.C:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

func (p *wakingPressure) readsSince(t0 time.Time) []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []time.Duration
	for _, r := range p.reads {
		out = append(out, r.Sub(t0))
	}
	return out
}

// TestDriverPressureWake: a driver whose PressureSource is a
// PressureWaker reads the pressure marks as soon as it is woken (the
// gateways flushed new marks), not at its next interval; a wake-up sooner
// than PressureInterval/10 after the last read waits for that tenth;
// after a read the next one is an interval later. In virtual time, so the
// read times are exact.
func TestDriverPressureWake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := shares.Limit{RateMilli: 300_000, BurstMilli: 300_000, Regions: 2}
		keys := []Key{{PolicyID: "p", Subject: "k:a"}}
		w := newWorld(t, []string{"eu", "us"}, lim, keys)
		w.demand = func(string, int64, Key) int64 { return 0 }
		cfg := driverTestConfig()
		cfg.Region, cfg.Regions, cfg.Epoch = "eu", w.regions, 4*time.Second
		core, err := New(cfg, PolicyMap{"p": lim})
		require.NoError(t, err)
		p := &wakingPressure{fakePressure: &fakePressure{w: w, region: "eu", epoch: cfg.Epoch}, wake: make(chan struct{}, 1)}
		tb := &memTransfers{w: w, region: "eu", inbox: make(chan transferIn, 16)}
		tb.all = map[string]*memTransfers{"eu": tb}
		d, err := NewDriver(core, DriverConfig{
			Usage: &fakeSource{w: w, region: "eu"}, Shares: &fakeSink{w: w, region: "eu"}, Bus: w.ports["eu"],
			Pressure: p, Transfers: tb, PressureInterval: time.Second,
		})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		t0 := time.Now()
		go func() { assert.ErrorIs(t, d.Run(ctx), context.Canceled) }()
		wakeAt := func(at time.Duration) {
			time.Sleep(time.Until(t0.Add(at)))
			select {
			case p.wake <- struct{}{}:
			default:
				t.Errorf("at %v: the last wake-up was not taken", at)
			}
			synctest.Wait()
		}
		wakeAt(2500 * time.Millisecond) // a flush marked pressure: read at once
		wakeAt(2550 * time.Millisecond) // another, 50 ms later: read at 2.6 s
		time.Sleep(time.Until(t0.Add(4 * time.Second)))
		synctest.Wait()
		assert.Equal(t, []time.Duration{time.Second, 2 * time.Second, 2500 * time.Millisecond, 2600 * time.Millisecond, 3600 * time.Millisecond},
			p.readsSince(t0), "reads every second, at a wake-up, a tenth after it, then a second later")
		assert.Equal(t, int64(2), d.Status().Transfers.Wakes)
		cancel()
		synctest.Wait()
	})
}

// stalePressure is a wakingPressure that also lists keys[0] as under
// pressure while staleUntil has not passed: the old region's gateways'
// last flush, which still shows the rejections of the traffic that left.
type stalePressure struct {
	*wakingPressure
	mu         sync.Mutex
	staleUntil time.Time
}

func (p *stalePressure) Pressure(ctx context.Context, now time.Time) ([]Pressure, error) {
	out, err := p.wakingPressure.Pressure(ctx, now)
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.Before(p.staleUntil) {
		out = append(out, Pressure{Key: p.w.keys[0], DemandMilli: 1_000})
	}
	return out, err
}

// TestDriverReasksARefusedAsk: through two Drivers with production's
// 1 s pressure interval, read in phase, the new region's first ask after
// a shift is refused (the old region's last read still lists the key
// under pressure); the old region is woken when its gateways flush
// without the traffic, and the new region's re-ask half a second after
// its ask is answered, so it holds 90% of L before its next read. In
// virtual time.
func TestDriverReasksARefusedAsk(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const epoch = 4 * time.Second
		w, lim, keys, moveTo := shiftWorld(t)
		ctx, cancel := context.WithCancel(t.Context())
		eu := &stalePressure{wakingPressure: &wakingPressure{fakePressure: &fakePressure{w: w, region: "eu", epoch: epoch}, wake: make(chan struct{}, 1)}}
		us := &wakingPressure{fakePressure: &fakePressure{w: w, region: "us", epoch: epoch}, wake: make(chan struct{})}
		t0 := time.Now()
		rig := startTransferRigEvery(t, ctx, w, epoch, 0, time.Second, func(name string) PressureSource {
			if name == "eu" {
				return eu
			}
			return us
		})
		w.watch(12*epoch, keys[0])
		require.Greater(t, w.enforced("eu", keys[0]).RateMilli, lim.RateMilli*9/10, "eu holds most of L")

		// The shift 100 ms into an epoch, 100 ms after a read of both
		// (they read at whole seconds after t0); eu's next read (at
		// +0.9 s) still shows its gateways' rejections.
		m := EpochOf(time.Now(), epoch) + 1
		shift := EpochStart(m, epoch).Add(100 * time.Millisecond)
		require.Equal(t, 100*time.Millisecond, shift.Sub(t0)%time.Second, "reads at whole seconds after t0, 100 ms before the shift")
		eu.mu.Lock()
		eu.staleUntil = shift.Add(time.Second)
		eu.mu.Unlock()
		time.Sleep(time.Until(shift))
		moveTo(m)
		ask := shift.Add(900 * time.Millisecond) // us's first read after the shift: it asks
		time.Sleep(time.Until(ask.Add(200 * time.Millisecond)))
		synctest.Wait()
		assert.Less(t, w.enforced("us", keys[0]).RateMilli, lim.RateMilli/10, "the ask was refused: eu still read pressure")
		eu.wake <- struct{}{} // eu's gateways flush without the traffic
		time.Sleep(time.Until(ask.Add(800 * time.Millisecond)))
		synctest.Wait()
		assert.Greater(t, w.enforced("us", keys[0]).RateMilli, lim.RateMilli*9/10, "the re-ask, half a second after the ask, was answered before us's next read")
		assert.Equal(t, 1, rig.logs["us"].count(GiveReceived, ""), "one give accepted")
		cancel()
		synctest.Wait()
	})
}
