package quota

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// ledger is the test's own record of every assignment the core sent, from
// which it computes what the Envoys may admit: an assignment sent at t with
// TTL d binds the Envoy until t + d + InFlight (it reaches the Envoy within
// InFlight and the Envoy enforces it for d from then). An Envoy enforces
// one assignment at a time, so its rate is the largest of those still
// binding. Bursts add up: every assignment that is not an extension starts
// a fresh, full Envoy token bucket, so its burst is held (may still be
// spent) until it stops binding, whatever the Envoy spent of the buckets
// before it. An assignment is an extension only when it is the same
// strategy as the Envoy's last one and is sure to reach the Envoy before
// that one expires there (sent before last sent + d - InFlight); it then
// prolongs the last one's bucket. Encoded strategies are decoded, so
// rounding on the wire is checked too.
type ledger struct {
	inFlight time.Duration
	sent     map[EnvoyID][]sentGrant
}

type sentGrant struct {
	amt    Amount
	sentAt time.Time
	ttl    time.Duration
	until  time.Time
}

func newLedger(cfg Config) *ledger {
	return &ledger{inFlight: cfg.InFlight, sent: map[EnvoyID][]sentGrant{}}
}

func (l *ledger) record(now time.Time, acts []Action) {
	for _, a := range acts {
		if a.Abandon {
			continue
		}
		amt, unlimited := AmountOf(Strategy(a.Unlimited, a.Amount))
		if unlimited {
			continue
		}
		l.add(now, a.Envoy, amt, a.TTL)
	}
}

// add records one assignment of amt (decoded from the wire) sent to e at
// now with TTL ttl.
func (l *ledger) add(now time.Time, e EnvoyID, amt Amount, ttl time.Duration) {
	gs := l.sent[e]
	if n := len(gs); n > 0 && gs[n-1].amt == amt && now.Add(l.inFlight).Before(gs[n-1].sentAt.Add(gs[n-1].ttl)) {
		last := &gs[n-1]
		last.sentAt, last.ttl = now, ttl
		if u := now.Add(ttl + l.inFlight); u.After(last.until) {
			last.until = u
		}
		return
	}
	l.sent[e] = append(gs, sentGrant{amt: amt, sentAt: now, ttl: ttl, until: now.Add(ttl + l.inFlight)})
}

// total is what the Envoys may admit at now: the sum of their rates, and
// of every burst still held.
func (l *ledger) total(now time.Time) Amount {
	var sum Amount
	for _, gs := range l.sent {
		var rate int64
		for _, g := range gs {
			if now.Before(g.until) {
				rate = max(rate, g.amt.RateMilli)
				sum.BurstMilli += g.amt.BurstMilli
			}
		}
		sum.RateMilli += rate
	}
	return sum
}

// TestCoreInvariantRandom drives the core with random sequences of
// subscriptions, reports, disconnects, share changes, ticks and time
// passing (grants running out), and after every event checks, from the
// ledger of what was sent:
//   - an event never raises the total above the share in force;
//   - the total is within the share whenever the share was not lowered
//     during the last TTL + InFlight (a lowered share cannot take back
//     what was granted; it binds once those grants run out);
//   - and always within the largest share of that window.
func TestCoreInvariantRandom(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runInvariant(t, seed) })
	}
}

type shareAt struct {
	at    time.Time
	share Amount
}

func runInvariant(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	cfg := DefaultConfig()
	cfg.TTL = time.Duration(1+rng.IntN(5)) * time.Second
	cfg.InFlight = time.Duration(rng.IntN(1500)) * time.Millisecond
	cfg.ThresholdPermille = int64(rng.IntN(300))
	cfg.IdleTimeout = time.Duration(2+rng.IntN(20)) * time.Second
	c, err := NewCore(cfg)
	require.NoError(t, err)
	l := newLedger(cfg)
	const k = BucketKey("d/path=/api")
	now := t0
	hold := cfg.TTL + cfg.InFlight
	randShare := func() Amount {
		return Amount{RateMilli: rng.Int64N(200_000), BurstMilli: rng.Int64N(400_000)}
	}
	share := randShare()
	history := []shareAt{{now, share}}
	l.record(now, c.SetShare(now, k, share, false))
	connected := map[EnvoyID]bool{}
	next := EnvoyID(1)
	report := func(e EnvoyID, u Usage) {
		if !c.Known(k) { // forgotten when nobody was left
			l.record(now, c.SetShare(now, k, share, false))
		}
		l.record(now, c.Report(now, e, k, u))
	}
	for step := 0; step < 400; step++ {
		before := l.total(now)
		var event string
		switch r := rng.IntN(100); {
		case r < 10 || len(connected) == 0:
			event = "subscribe"
			e := next
			next++
			connected[e] = true
			report(e, Usage{Allowed: uint64(rng.IntN(3))})
		case r < 50:
			event = "report"
			e := pick(rng, connected)
			u := Usage{Allowed: uint64(rng.IntN(500)), Denied: uint64(rng.IntN(500)), Elapsed: time.Duration(1+rng.IntN(3000)) * time.Millisecond}
			if rng.IntN(5) == 0 {
				u.Allowed, u.Denied = 0, 0
			}
			report(e, u)
		case r < 58:
			event = "disconnect"
			e := pick(rng, connected)
			delete(connected, e)
			l.record(now, c.Disconnect(now, e))
		case r < 68:
			event = "share"
			share = randShare()
			history = append(history, shareAt{now, share})
			l.record(now, c.SetShare(now, k, share, false))
		case r < 85:
			event = "tick"
			l.record(now, c.Tick(now))
		default:
			event = "time"
			now = now.Add(time.Duration(rng.IntN(int(cfg.TTL/time.Millisecond)+500)) * time.Millisecond)
			l.record(now, c.Tick(now))
		}
		after := l.total(now)
		ctx := fmt.Sprintf("seed %d step %d (%s): total %+v, before %+v, share %+v", seed, step, event, after, before, share)
		if !after.fits(share) {
			// Only a share lowered within the window may leave the total
			// above the share, and no event may add to it then.
			require.True(t, after.RateMilli <= max(before.RateMilli, share.RateMilli) && after.BurstMilli <= max(before.BurstMilli, share.BurstMilli), "an event raised the total above the share: "+ctx)
			var lowered bool
			var top Amount
			for _, h := range history {
				if now.Sub(h.at) < hold {
					lowered = true
				}
			}
			top = share
			for i, h := range history {
				// The share in force at any time of the window.
				if i+1 < len(history) && now.Sub(history[i+1].at) >= hold {
					continue
				}
				top = maxAmount(top, h.share)
			}
			require.True(t, lowered, "total above the share with no share change in the last TTL+InFlight: "+ctx)
			require.True(t, after.fits(top), "total above every share of the window: "+ctx)
		}
		// The core's own accounting agrees with the ledger or is more
		// conservative.
		require.True(t, after.fits(c.Reserved(now, k)), "core reserves less than the ledger: core %+v, %s", c.Reserved(now, k), ctx)
	}
}

func pick(rng *rand.Rand, m map[EnvoyID]bool) EnvoyID {
	ids := make([]EnvoyID, 0, len(m))
	for e := range m {
		ids = append(ids, e)
	}
	if len(ids) == 0 {
		return 0
	}
	// Map order is random; sort for reproducibility.
	for i := 1; i < len(ids); i++ {
		for j := i; j > 0 && ids[j] < ids[j-1]; j-- {
			ids[j], ids[j-1] = ids[j-1], ids[j]
		}
	}
	return ids[rng.IntN(len(ids))]
}

func TestSplitMaxMinFair(t *testing.T) {
	share := Amount{RateMilli: 100_000, BurstMilli: 200_000}
	for _, tc := range []struct {
		name    string
		demands []int64
		rates   []int64
	}{
		{"all satisfied, leftover split equally", []int64{10_000, 20_000}, []int64{45_000, 55_000}},
		{"one small, two capped", []int64{10_000, 80_000, 300_000}, []int64{10_000, 45_000, 45_000}},
		{"equal when all exceed", []int64{500_000, 500_000}, []int64{50_000, 50_000}},
		{"no demand: equal", []int64{0, 0, 0, 0}, []int64{25_000, 25_000, 25_000, 25_000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := split(share, tc.demands)
			var rates []int64
			var sum Amount
			for _, a := range got {
				rates = append(rates, a.RateMilli)
				sum = sum.add(a)
				assert.GreaterOrEqual(t, a.BurstMilli, int64(1000), "every Envoy gets one request of burst")
			}
			assert.Equal(t, tc.rates, rates)
			assert.True(t, sum.fits(share), "sum %+v within %+v", sum, share)
		})
	}
}

func TestStrategyRoundsDown(t *testing.T) {
	for _, a := range []Amount{{1, 1000}, {1500, 3000}, {1234, 999_999}, {10_000_000, 20_000_000}, {99_999_999, 5000}, {7, 1000}} {
		got, unlimited := AmountOf(Strategy(false, a))
		assert.False(t, unlimited)
		assert.True(t, got.fits(a), "%+v decodes to %+v", a, got)
		assert.GreaterOrEqual(t, got.RateMilli, a.RateMilli-a.RateMilli/1_000_000-1, "rate %+v decodes to %+v", a, got)
		assert.Equal(t, a.BurstMilli/1000*1000, got.BurstMilli)
	}
	got, unlimited := AmountOf(Strategy(false, Amount{RateMilli: 5000, BurstMilli: 999}))
	assert.False(t, unlimited)
	assert.Equal(t, Amount{}, got, "under one request of burst is DENY_ALL")
	_, unlimited = AmountOf(Strategy(true, Amount{}))
	assert.True(t, unlimited)
}

// The report Envoy sends when it receives an assignment covers only the
// time since its last one; a few milliseconds without a request do not
// make its demand zero (which would shrink its assignment and start a
// loop of re-sends and reports).
func TestShortReportsAccumulate(t *testing.T) {
	c, err := NewCore(DefaultConfig())
	require.NoError(t, err)
	const k = BucketKey("b")
	now := t0
	c.SetShare(now, k, Amount{RateMilli: 100_000, BurstMilli: 100_000}, false)
	c.Report(now, 1, k, Usage{Allowed: 50, Elapsed: time.Second})
	c.Report(now, 2, k, Usage{Allowed: 10, Elapsed: time.Second})
	now = now.Add(10 * time.Second) // every grant ran out
	acts := c.Tick(now)
	require.Len(t, acts, 2)
	assert.Equal(t, int64(70_000), acts[0].Amount.RateMilli, "50 + half of the 40 left")
	// Envoy 1's report on receipt: 10 ms, no request.
	acts = c.Report(now, 1, k, Usage{Elapsed: 10 * time.Millisecond})
	assert.Empty(t, acts, "demand unchanged until reports cover MinElapsed")
	// Its next regular report completes the span: 45 requests over 1 s.
	acts = c.Report(now.Add(time.Second), 1, k, Usage{Allowed: 45, Elapsed: 990 * time.Millisecond})
	assert.Empty(t, acts, "45/s is within the threshold of 50/s")
}
