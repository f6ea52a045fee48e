package rebalancer

import (
	"fmt"
	"testing"
	"time"

	"github.com/quotientlabs/quotient/shares"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The unit tests of the transfer rules run two regions, a and b, whose
// Cores adopted their stores' records (no warm-up) and exchanged three
// epochs of reports, so both decided without falling back; a has the
// demand, b none.

var (
	xlim = shares.Limit{RateMilli: 100_000, BurstMilli: 200_000, Regions: 2}
	xpol = PolicyMap{"api": xlim}
)

type tpair struct {
	t    *testing.T
	a, b *Core
	m    int64 // the epoch both collected last
}

func newTransferPair(t *testing.T) *tpair { return newTransferPairWith(t, nil) }

// newTransferPairWith is newTransferPair with both Configs changed by
// tune (when not nil).
func newTransferPairWith(t *testing.T, tune func(*Config)) *tpair {
	p := &tpair{t: t, m: e0}
	ca, cb := testConfig("a", "a", "b"), testConfig("b", "a", "b")
	if tune != nil {
		tune(&ca)
		tune(&cb)
	}
	var err error
	p.a, err = New(ca, xpol)
	require.NoError(t, err)
	p.b, err = New(cb, xpol)
	require.NoError(t, err)
	for _, c := range []*Core{p.a, p.b} {
		_, err := c.Adopt(t0, nil)
		require.NoError(t, err)
	}
	// Fallback (nobody heard yet), then no growth (the second reports
	// want nothing after a fallback), then growth.
	p.step(80_000, 0)
	p.step(80_000, 0)
	p.step(80_000, 0)
	require.False(t, p.a.fallback)
	require.False(t, p.b.fallback)
	return p
}

// now is a time in the epoch after the one collected last, after its
// collection.
func (p *tpair) now() time.Time { return EpochStart(p.m+1, 10*time.Second).Add(3 * time.Second) }

// step collects the next epoch in both regions with demand rates da and
// db (milli per second), exchanges the reports and decides.
func (p *tpair) step(da, db int64) {
	p.collect(da, db)
	p.decide()
}

func (p *tpair) collect(da, db int64) {
	p.m++
	at := EpochStart(p.m+1, 10*time.Second).Add(time.Second)
	pa, err := p.a.Collect(at, []Usage{{Key: hot, Demand: da / 100, Admitted: da / 100}})
	require.NoError(p.t, err)
	pb, err := p.b.Collect(at, []Usage{{Key: hot, Demand: db / 100, Admitted: db / 100}})
	require.NoError(p.t, err)
	require.NotNil(p.t, pa.Report)
	require.NotNil(p.t, pb.Report)
	_, err = p.a.Receive(pb.Report)
	require.NoError(p.t, err)
	_, err = p.b.Receive(pa.Report)
	require.NoError(p.t, err)
}

func (p *tpair) decide() {
	at := EpochStart(p.m+1, 10*time.Second).Add(2 * time.Second)
	for _, c := range []*Core{p.a, p.b} {
		require.True(p.t, c.Due(at))
		_, err := c.Decide(at)
		require.NoError(p.t, err)
	}
}

func share(c *Core, k Key) shares.Share {
	if s, ok := c.Share(k); ok {
		return s
	}
	return xlim.Default()
}

// transfer runs b's ask for hot at full demand and a's answer with no
// demand of its own; it returns the give (nil when a gave nothing).
func (p *tpair) transfer(now time.Time) *Give {
	ask := p.b.Pressure(now, []Pressure{{Key: hot, DemandMilli: 100_000}})
	require.NotNil(p.t, ask)
	ups, give, err := p.a.ReceiveAsk(now, ask, nil)
	require.NoError(p.t, err)
	if give != nil {
		require.Len(p.t, ups, 1)
		assert.Equal(p.t, share(p.a, hot), ups[0].Share, "the update writes the lowered share")
	}
	return give
}

// ask returns b's last Need for hot (asking again, after AskInterval).
func ask(t *testing.T, p *tpair) shares.Share {
	a := p.b.Pressure(p.now().Add(5*time.Second), []Pressure{{Key: hot, DemandMilli: 100_000}})
	require.NotNil(t, a)
	return a.Keys[0].Need
}

func TestGiveMovesShareAndDecisionsKeepIt(t *testing.T) {
	p := newTransferPair(t)
	now := p.now()
	a0, b0 := share(p.a, hot), share(p.b, hot)
	require.Greater(t, a0.RateMilli, xlim.Default().RateMilli, "a holds most of the limit")
	give := p.transfer(now)
	require.NotNil(t, give)
	assert.Equal(t, "a", give.From)
	assert.Equal(t, "b", give.To)
	assert.Equal(t, p.m+1, give.Transfer)
	require.Len(t, give.Keys, 1)
	amt := give.Keys[0].Amount
	assert.Positive(t, amt.RateMilli)
	assert.Equal(t, shares.Share{RateMilli: a0.RateMilli - amt.RateMilli, BurstMilli: a0.BurstMilli - amt.BurstMilli}, share(p.a, hot))
	// b asked for (100/s less three Poisson deviations, 30/s)*1.25 less
	// its share; a, with no demand, could give all but its floor.
	need := int64(87_500) - b0.RateMilli
	assert.Equal(t, need, ask(t, p).RateMilli)
	assert.Equal(t, min(need, a0.RateMilli-xlim.Default().RateMilli*15/1000), amt.RateMilli)

	ups, err := p.b.ReceiveGive(now, give)
	require.NoError(t, err)
	require.Len(t, ups, 1)
	got := share(p.b, hot)
	assert.Equal(t, shares.Share{RateMilli: b0.RateMilli + amt.RateMilli, BurstMilli: b0.BurstMilli + amt.BurstMilli}, got)
	assert.Equal(t, got, ups[0].Share)
	assert.Equal(t, int64(1), p.b.Stats().Accepted)

	// The next decisions keep it: b's smoothed demand lags, but its
	// pressure (read every second) shows the demand.
	p.b.Pressure(EpochStart(p.m+2, 10*time.Second).Add(500*time.Millisecond), []Pressure{{Key: hot, DemandMilli: 100_000}})
	p.step(0, 100_000)
	assert.GreaterOrEqual(t, share(p.b, hot).RateMilli, got.RateMilli, "b keeps what it accepted")
	sum := share(p.a, hot).RateMilli + share(p.b, hot).RateMilli
	assert.LessOrEqual(t, sum, xlim.RateMilli)
}

func TestDecisionSubtractsGivenAndAddsAccepted(t *testing.T) {
	// Two identical pairs, one with a transfer before the decisions: the
	// decisions differ by exactly the amount.
	p, q := newTransferPair(t), newTransferPair(t)
	p.collect(80_000, 0)
	q.collect(80_000, 0)
	now := p.now()
	give := p.transfer(now)
	require.NotNil(t, give)
	_, err := p.b.ReceiveGive(now, give)
	require.NoError(t, err)
	p.decide()
	q.decide()
	amt := give.Keys[0].Amount
	qa, qb := share(q.a, hot), share(q.b, hot)
	assert.Equal(t, shares.Share{RateMilli: qa.RateMilli - amt.RateMilli, BurstMilli: qa.BurstMilli - amt.BurstMilli}, share(p.a, hot))
	assert.Equal(t, shares.Share{RateMilli: qb.RateMilli + amt.RateMilli, BurstMilli: qb.BurstMilli + amt.BurstMilli}, share(p.b, hot))
}

func TestGiveRefusedForAnotherPeriod(t *testing.T) {
	for _, tc := range []struct {
		name string
		// late moves the receiver on by one collection before the gift
		// arrives; else the giver gives for the period after b's.
		late bool
	}{{name: "receiver collected since", late: true}, {name: "giver ahead"}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTransferPair(t)
			now := p.now()
			give := p.transfer(now)
			require.NotNil(t, give)
			if tc.late {
				p.step(0, 100_000) // b's report of T claims no gift
				now = p.now()
			} else {
				give.Transfer++ // a collected one epoch more than b
			}
			before := share(p.b, hot)
			ups, err := p.b.ReceiveGive(now, give)
			require.NoError(t, err)
			assert.Empty(t, ups)
			assert.Equal(t, before, share(p.b, hot))
			assert.Equal(t, int64(1), p.b.Stats().Refused)
			assert.Equal(t, give.Keys[0].Amount.RateMilli, p.b.Stats().DroppedAmount)
		})
	}
}

func TestDuplicateGiveRefused(t *testing.T) {
	p := newTransferPair(t)
	now := p.now()
	give := p.transfer(now)
	require.NotNil(t, give)
	ups, err := p.b.ReceiveGive(now, give)
	require.NoError(t, err)
	require.Len(t, ups, 1)
	after := share(p.b, hot)
	ups, err = p.b.ReceiveGive(now.Add(time.Second), give)
	require.NoError(t, err)
	assert.Empty(t, ups)
	assert.Equal(t, after, share(p.b, hot))
	assert.Equal(t, int64(1), p.b.Stats().Refused)

	// A duplicated ask is answered once (a has spare again).
	p.a.held(hot).share = shares.Share{RateMilli: 60_000, BurstMilli: 120_000}
	ask := &Ask{Region: "b", Epoch: p.m, Keys: []AskKey{{Key: hot, Need: shares.Share{RateMilli: 1000, BurstMilli: 2000}}}}
	before := share(p.a, hot)
	ups, g2, err := p.a.ReceiveAsk(now.Add(100*time.Millisecond), ask, nil)
	require.NoError(t, err)
	assert.Nil(t, g2)
	assert.Empty(t, ups)
	assert.Equal(t, before, share(p.a, hot))
	ups, g2, err = p.a.ReceiveAsk(now.Add(249*time.Millisecond), ask, nil)
	require.NoError(t, err)
	assert.Nil(t, g2, "a quarter of an AskInterval: still a duplicate")
	assert.Empty(t, ups)
	// Half an interval after the gift it is the asker's next ask (the read
	// after a re-ask), answered.
	_, g2, err = p.a.ReceiveAsk(now.Add(500*time.Millisecond), ask, nil)
	require.NoError(t, err)
	assert.NotNil(t, g2)
}

// cutOff runs epochs in which b hears nothing from a until b's decision
// is in fallback (K-1 epochs: a's last report b has says a heard b one
// epoch before it); the last epoch is collected but not decided when
// undecided is set.
func (p *tpair) cutOff(undecided bool) {
	k := p.b.Config().SilenceEpochs - 1
	for i := range k {
		p.m++
		at := EpochStart(p.m+1, 10*time.Second).Add(time.Second)
		_, err := p.b.Collect(at, []Usage{{Key: hot, Demand: 1000, Admitted: 1000}})
		require.NoError(p.t, err)
		if i == k-1 && undecided {
			return
		}
		_, err = p.b.Decide(at.Add(time.Second))
		require.NoError(p.t, err)
	}
}

func TestTransfersRefusedInFallback(t *testing.T) {
	p := newTransferPair(t)
	p.cutOff(false)
	require.True(t, p.b.fallback)
	now := p.now()
	assert.Nil(t, p.b.Pressure(now, []Pressure{{Key: hot, DemandMilli: 100_000}}), "no ask in fallback")

	before := share(p.b, hot)
	g := &Give{From: "a", To: "b", ID: 1, Transfer: p.m + 1, Keys: []GiveKey{{Key: hot, Amount: shares.Share{RateMilli: 10_000, BurstMilli: 20_000}}}}
	ups, err := p.b.ReceiveGive(now, g)
	require.NoError(t, err)
	assert.Empty(t, ups, "a region in fallback refuses gifts")
	assert.Equal(t, before, share(p.b, hot))
	assert.Equal(t, int64(1), p.b.Stats().Refused)

	// And gives nothing, even with spare.
	p.b.held(hot).share = shares.Share{RateMilli: 40_000, BurstMilli: 80_000}
	ask := &Ask{Region: "a", Epoch: p.m, Keys: []AskKey{{Key: hot, Need: shares.Share{RateMilli: 10_000, BurstMilli: 20_000}}}}
	ups, give, err := p.b.ReceiveAsk(now, ask, nil)
	require.NoError(t, err)
	assert.Nil(t, give)
	assert.Empty(t, ups)
}

func TestFallbackDecisionDropsWhatWasAccepted(t *testing.T) {
	p := newTransferPair(t)
	// b's next decision will be in fallback; before it, while its last
	// decision was not, b accepts a gift.
	p.cutOff(true)
	require.False(t, p.b.fallback)
	now := EpochStart(p.m+1, 10*time.Second).Add(1500 * time.Millisecond)
	g := &Give{From: "a", To: "b", ID: 1, Transfer: p.m + 1, Keys: []GiveKey{{Key: hot, Amount: shares.Share{RateMilli: 60_000, BurstMilli: 120_000}}}}
	ups, err := p.b.ReceiveGive(now, g)
	require.NoError(t, err)
	require.Len(t, ups, 1)
	require.Greater(t, share(p.b, hot).RateMilli, xlim.Default().RateMilli)
	_, err = p.b.Decide(now.Add(time.Second))
	require.NoError(t, err)
	require.True(t, p.b.fallback)
	assert.LessOrEqual(t, share(p.b, hot).RateMilli, xlim.Default().RateMilli, "in fallback, nothing accepted is added")
	assert.LessOrEqual(t, share(p.b, hot).BurstMilli, xlim.Default().BurstMilli)
}

func TestTransfersRefusedInWarmup(t *testing.T) {
	p := newTransferPair(t)
	now := p.now()
	give := p.transfer(now)
	require.NotNil(t, give)
	// b restarts: a fresh Core, in warm-up, that collected the epoch.
	fresh, err := New(testConfig("b", "a", "b"), xpol)
	require.NoError(t, err)
	_, err = fresh.Collect(EpochStart(p.m+1, 10*time.Second).Add(time.Second), nil)
	require.NoError(t, err)
	give.Transfer = p.m + 1
	require.True(t, fresh.warm(fresh.published))
	ups, err := fresh.ReceiveGive(now, give)
	require.NoError(t, err)
	assert.Empty(t, ups)
	assert.Equal(t, int64(1), fresh.Stats().Refused)
	assert.Nil(t, fresh.Pressure(now, []Pressure{{Key: hot, DemandMilli: 100_000}}))
	ask := &Ask{Region: "a", Epoch: p.m, Keys: []AskKey{{Key: hot, Need: shares.Share{RateMilli: 1000, BurstMilli: 2000}}}}
	ups, g, err := fresh.ReceiveAsk(now, ask, nil)
	require.NoError(t, err)
	assert.Nil(t, g)
	assert.Empty(t, ups)
}

func TestNoCascades(t *testing.T) {
	p := newTransferPair(t)
	now := p.now()
	give := p.transfer(now)
	require.NotNil(t, give)
	_, err := p.b.ReceiveGive(now, give)
	require.NoError(t, err)
	// b accepted hot this period: it gives none of it, even with spare.
	p.b.held(hot).share = shares.Share{RateMilli: 90_000, BurstMilli: 180_000}
	ask := &Ask{Region: "a", Epoch: p.m, Keys: []AskKey{{Key: hot, Need: shares.Share{RateMilli: 10_000, BurstMilli: 20_000}}}}
	ups, g, err := p.b.ReceiveAsk(now, ask, nil)
	require.NoError(t, err)
	assert.Nil(t, g)
	assert.Empty(t, ups)
	// a gave hot this period: it does not ask for it back, nor accept
	// any of it.
	assert.Nil(t, p.a.Pressure(now.Add(2*time.Second), []Pressure{{Key: hot, DemandMilli: 100_000}}))
	before := share(p.a, hot)
	back := &Give{From: "b", To: "a", ID: 7, Transfer: p.m + 1, Keys: []GiveKey{{Key: hot, Amount: shares.Share{RateMilli: 1000, BurstMilli: 2000}}}}
	ups, err = p.a.ReceiveGive(now, back)
	require.NoError(t, err)
	assert.Empty(t, ups)
	assert.Equal(t, before, share(p.a, hot))
	assert.Equal(t, int64(1), p.a.Stats().RefusedKeys)
	// The next period both may again.
	p.step(0, 0)
	assert.NotNil(t, p.a.Pressure(p.now(), []Pressure{{Key: hot, DemandMilli: 100_000}}))
}

func TestTransfersNeverMixShares(t *testing.T) {
	def := xlim.Default() // 50_000, 100_000
	t.Run("giver keeps the part that would mix", func(t *testing.T) {
		p := newTransferPair(t)
		// Above the default in both, with little burst to spare.
		p.a.held(hot).share = shares.Share{RateMilli: 90_000, BurstMilli: 101_000}
		ask := &Ask{Region: "b", Epoch: p.m, Keys: []AskKey{{Key: hot, Need: shares.Share{RateMilli: 20_000, BurstMilli: 40_000}}}}
		ups, g, err := p.a.ReceiveAsk(p.now(), ask, nil)
		require.NoError(t, err)
		require.NotNil(t, g)
		require.Len(t, ups, 1)
		assert.False(t, xlim.Mixed(ups[0].Share), "%+v", ups[0].Share)
		assert.Equal(t, shares.Share{RateMilli: 70_000, BurstMilli: def.BurstMilli}, ups[0].Share)
		assert.Equal(t, shares.Share{RateMilli: 20_000, BurstMilli: 1000}, g.Keys[0].Amount)
	})
	t.Run("receiver drops the part that would mix", func(t *testing.T) {
		p := newTransferPair(t)
		p.b.held(hot).share = shares.Share{RateMilli: 45_000, BurstMilli: 60_000}
		g := &Give{From: "a", To: "b", ID: 1, Transfer: p.m + 1, Keys: []GiveKey{{Key: hot, Amount: shares.Share{RateMilli: 10_000, BurstMilli: 20_000}}}}
		ups, err := p.b.ReceiveGive(p.now(), g)
		require.NoError(t, err)
		require.Len(t, ups, 1)
		assert.Equal(t, shares.Share{RateMilli: def.RateMilli, BurstMilli: 80_000}, ups[0].Share)
		assert.Equal(t, int64(5_000), p.b.Stats().DroppedAmount)
	})
	t.Run("decision", func(t *testing.T) {
		// a gave a rate-only amount between its report and its
		// decision: Next minus it would be below the default in rate
		// and above in burst.
		p := newTransferPair(t)
		p.collect(80_000, 0)
		p.a.held(hot).share.RateMilli -= 60_000 // as if a gave it
		p.a.xkey(hot).given = shares.Share{RateMilli: 60_000}
		p.decide()
		s := share(p.b, hot)
		assert.False(t, xlim.Mixed(s), "%+v", s)
		s = share(p.a, hot)
		assert.False(t, xlim.Mixed(s), "%+v", s)
	})
}

func TestTransferErrors(t *testing.T) {
	p := newTransferPair(t)
	now := p.now()
	for _, tc := range []struct {
		name string
		ask  *Ask
		msg  string
	}{
		{"nil", nil, "nil ask"},
		{"unknown region", &Ask{Region: "x"}, `Region "x"`},
		{"negative", &Ask{Region: "b", Keys: []AskKey{{Key: hot, Need: shares.Share{RateMilli: -1}}}}, "negative Need"},
		{"twice", &Ask{Region: "b", Keys: []AskKey{{Key: hot}, {Key: hot}}}, "twice"},
		{"empty policy", &Ask{Region: "b", Keys: []AskKey{{}}}, "PolicyID is empty"},
	} {
		_, _, err := p.a.ReceiveAsk(now, tc.ask, nil)
		require.ErrorIs(t, err, ErrTransfer, tc.name)
		assert.Contains(t, err.Error(), tc.msg, tc.name)
	}
	for _, tc := range []struct {
		name string
		give *Give
		msg  string
	}{
		{"nil", nil, "nil give"},
		{"unknown from", &Give{From: "x", To: "b"}, `From "x"`},
		{"unknown to", &Give{From: "a", To: "x"}, `To "x"`},
		{"self", &Give{From: "b", To: "b"}, "to itself"},
		{"negative", &Give{From: "a", To: "b", Keys: []GiveKey{{Key: hot, Amount: shares.Share{BurstMilli: -1}}}}, "negative Amount"},
		{"twice", &Give{From: "a", To: "b", Keys: []GiveKey{{Key: hot}, {Key: hot}}}, "twice"},
	} {
		_, err := p.b.ReceiveGive(now, tc.give)
		require.ErrorIs(t, err, ErrTransfer, tc.name)
		assert.Contains(t, err.Error(), tc.msg, tc.name)
	}
	assert.Zero(t, p.b.Stats().Refused, "a malformed give is an error, not a refusal")
}

func TestTransfersOff(t *testing.T) {
	p := newTransferPair(t)
	p.a.cfg.Transfers, p.b.cfg.Transfers = false, false
	now := p.now()
	assert.Nil(t, p.b.Pressure(now, []Pressure{{Key: hot, DemandMilli: 100_000}}))
	ask := &Ask{Region: "b", Epoch: p.m, Keys: []AskKey{{Key: hot, Need: shares.Share{RateMilli: 10_000, BurstMilli: 20_000}}}}
	ups, g, err := p.a.ReceiveAsk(now, ask, nil)
	require.NoError(t, err)
	assert.Nil(t, g)
	assert.Empty(t, ups)
}

func TestAsksPerPeriodAreBounded(t *testing.T) {
	p := newTransferPair(t)
	asks := func() int {
		n := 0
		base := p.now()
		for i := range 6 {
			if p.b.Pressure(base.Add(time.Duration(i)*time.Second), []Pressure{{Key: hot, DemandMilli: 100_000}}) != nil {
				n++
			}
		}
		return n
	}
	// Not twice within half an AskInterval.
	now := p.now().Add(-time.Second)
	require.NotNil(t, p.b.Pressure(now, []Pressure{{Key: hot, DemandMilli: 100_000}}))
	assert.Nil(t, p.b.Pressure(now.Add(499*time.Millisecond), []Pressure{{Key: hot, DemandMilli: 100_000}}))
	// A read half an interval after the ask (woken by a flush, or the one
	// after it early) asks again.
	assert.NotNil(t, p.b.Pressure(now.Add(500*time.Millisecond), []Pressure{{Key: hot, DemandMilli: 100_000}}), "half an AskInterval after the last ask")
	p.b.xkey(hot).unanswered = 0 // (start the count below afresh)
	// Nobody answers: three asks in the period (one lost ask is asked
	// again), then two per period.
	assert.Equal(t, 3, asks())
	p.step(80_000, 100_000)
	assert.Equal(t, 2, asks())
	p.step(80_000, 100_000)
	assert.Equal(t, 2, asks())
	// A gift accepted starts the count again, and the period after one
	// with a gift is not dry.
	g := &Give{From: "a", To: "b", ID: 1, Transfer: p.m + 1, Keys: []GiveKey{{Key: hot, Amount: shares.Share{RateMilli: 1000, BurstMilli: 2000}}}}
	ups, err := p.b.ReceiveGive(p.now().Add(7*time.Second), g)
	require.NoError(t, err)
	require.Len(t, ups, 1)
	p.step(80_000, 100_000)
	assert.Equal(t, 3, asks())
}

// A giver keeps three requests per second above its one-second count of
// a key on the first ask (a count of 0 does not rule out a few per
// second), and gives the rest to the same asker's next ask within two ask
// intervals (a second low count in a row).
func TestGiverKeepsANoiseMarginOnTheFirstAsk(t *testing.T) {
	floor := xlim.Default().RateMilli * 15 / 1000
	askFor := func(p *tpair, at time.Time, need int64, own []Pressure) *Give {
		ask := &Ask{Region: "b", Epoch: p.m, Keys: []AskKey{{Key: hot, Need: shares.Share{RateMilli: need, BurstMilli: 2 * need}}}}
		_, g, err := p.a.ReceiveAsk(at, ask, own)
		require.NoError(t, err)
		return g
	}
	t.Run("a count of zero", func(t *testing.T) {
		p := newTransferPair(t)
		now := p.now()
		p.a.held(hot).share = shares.Share{RateMilli: 90_000, BurstMilli: 180_000}
		g := askFor(p, now, 90_000, nil)
		require.NotNil(t, g)
		assert.Equal(t, int64(87_000), g.Keys[0].Amount.RateMilli)
		assert.Equal(t, int64(3_000), share(p.a, hot).RateMilli, "three requests per second kept")
		g = askFor(p, now.Add(time.Second), 3_000, nil)
		require.NotNil(t, g, "the same asker's next ask")
		assert.Equal(t, floor, share(p.a, hot).RateMilli, "all but the floor given")
	})
	t.Run("a count of two", func(t *testing.T) {
		p := newTransferPair(t)
		p.a.held(hot).share = shares.Share{RateMilli: 90_000, BurstMilli: 180_000}
		g := askFor(p, p.now(), 90_000, []Pressure{{Key: hot, DemandMilli: 2_000}})
		require.NotNil(t, g)
		assert.Equal(t, int64(5_000), share(p.a, hot).RateMilli, "the count plus three requests, above its headroom (2.5/s)")
	})
	t.Run("a later ask starts over", func(t *testing.T) {
		p := newTransferPair(t)
		now := p.now()
		p.a.held(hot).share = shares.Share{RateMilli: 90_000, BurstMilli: 180_000}
		require.NotNil(t, askFor(p, now, 80_000, nil))
		require.Equal(t, int64(10_000), share(p.a, hot).RateMilli)
		require.NotNil(t, askFor(p, now.Add(2*time.Second+time.Millisecond), 80_000, nil))
		assert.Equal(t, int64(3_000), share(p.a, hot).RateMilli, "past two ask intervals the margin is kept again")
	})
}

// A giver's noise margin is three requests per pressure window
// (Config.AskInterval), not per second: over a fifth of a second (deployed
// mode's time-compressed runs) it keeps five times as much per second, as
// virtual time keeps over its one-second windows; over 1 s it is the margin
// tuned on the simulator's suite. The asker's margin stays three
// deviations of a second's count (askNoise's doc says why).
func TestGiveNoiseFollowsThePressureWindow(t *testing.T) {
	assert.Equal(t, int64(3_000), giveNoise(1000, time.Second), "three requests per second")
	assert.Equal(t, int64(15_000), giveNoise(1000, 200*time.Millisecond), "three requests per fifth of a second")
	assert.Equal(t, int64(6_000), giveNoise(2000, time.Second), "of the cheapest cost")
	assert.Equal(t, int64(30_000), askNoise(100_000), "3 sqrt(100) requests per second")

	for _, w := range []time.Duration{time.Second, 200 * time.Millisecond} {
		t.Run(w.String(), func(t *testing.T) {
			tune := func(c *Config) { c.AskInterval = w }
			p := newTransferPairWith(t, tune)
			const demand = 100_000
			before := share(p.b, hot).RateMilli
			ask := p.b.Pressure(p.now(), []Pressure{{Key: hot, DemandMilli: demand}})
			require.NotNil(t, ask)
			want := shares.MulDiv(demand-askNoise(demand), DefaultConfig().Shares.HeadroomPermille, 1000)
			assert.Equal(t, want-before, ask.Keys[0].Need.RateMilli, "(demand - three deviations of a second's count) x headroom, less the share, whatever the window")

			p = newTransferPairWith(t, tune)
			p.a.held(hot).share = shares.Share{RateMilli: 90_000, BurstMilli: 180_000}
			_, g, err := p.a.ReceiveAsk(p.now(), &Ask{Region: "b", Epoch: p.m, Keys: []AskKey{{Key: hot, Need: shares.Share{RateMilli: 90_000, BurstMilli: 180_000}}}}, nil)
			require.NoError(t, err)
			require.NotNil(t, g)
			assert.Equal(t, giveNoise(1000, w), share(p.a, hot).RateMilli, "a count of zero keeps three requests per window")
			assert.Equal(t, 90_000-giveNoise(1000, w), g.Keys[0].Amount.RateMilli)
		})
	}
}

// An ask refused because the giver's own gateways still rejected some of
// the key (its last flush before the traffic left) is asked again half an
// ask interval later (Core.Reask), once, with the same demand, and the
// giver, whose next read no longer lists the key, gives. An ask that got
// a gift is not repeated (the next read asks for the rest), nor is one
// for a key under pressure for more than two ask intervals (a busy key,
// not a shift: repeats there moved share on noise).
func TestReaskAfterARefusedAsk(t *testing.T) {
	pressure := []Pressure{{Key: hot, DemandMilli: 100_000}}
	t.Run("refused, then given", func(t *testing.T) {
		p := newTransferPair(t)
		now := p.now()
		p.a.Pressure(now.Add(-100*time.Millisecond), []Pressure{{Key: hot, DemandMilli: 40_000}})
		ask := p.b.Pressure(now, pressure)
		require.NotNil(t, ask)
		assert.Equal(t, now.Add(500*time.Millisecond), p.b.ReaskAt())
		_, g, err := p.a.ReceiveAsk(now, ask, []Pressure{{Key: hot, DemandMilli: 40_000}})
		require.NoError(t, err)
		require.Nil(t, g, "a's gateways reject some of it: no spare")
		assert.Nil(t, p.b.Reask(now.Add(499*time.Millisecond)), "not before ReaskAt")
		p.a.Pressure(now.Add(200*time.Millisecond), nil) // a's flush without the traffic
		again := p.b.Reask(now.Add(500 * time.Millisecond))
		require.NotNil(t, again)
		assert.Equal(t, ask.Keys, again.Keys, "the same need: nothing came in between")
		assert.True(t, p.b.ReaskAt().IsZero())
		assert.Nil(t, p.b.Reask(now.Add(time.Second)), "once per read")
		_, g, err = p.a.ReceiveAsk(now.Add(500*time.Millisecond), again, nil)
		require.NoError(t, err)
		require.NotNil(t, g)
		assert.Equal(t, int64(1), p.b.Stats().Reasks)
		assert.Equal(t, int64(2), p.b.Stats().Asks)
	})
	t.Run("a gift in between: the next read asks for the rest", func(t *testing.T) {
		p := newTransferPair(t)
		now := p.now()
		ask := p.b.Pressure(now, pressure)
		require.NotNil(t, ask)
		need := ask.Keys[0].Need.RateMilli
		g := &Give{From: "a", To: "b", ID: 1, Transfer: p.m + 1, Keys: []GiveKey{{Key: hot, Amount: shares.Share{RateMilli: need - 5_000, BurstMilli: 2 * (need - 5_000)}}}}
		_, err := p.b.ReceiveGive(now.Add(100*time.Millisecond), g)
		require.NoError(t, err)
		assert.Nil(t, p.b.Reask(now.Add(500*time.Millisecond)), "answered: not repeated")
		next := p.b.Pressure(now.Add(time.Second), pressure)
		require.NotNil(t, next)
		assert.Equal(t, int64(5_000), next.Keys[0].Need.RateMilli)
	})
	t.Run("given enough, no re-ask", func(t *testing.T) {
		p := newTransferPair(t)
		now := p.now()
		ask := p.b.Pressure(now, pressure)
		require.NotNil(t, ask)
		need := ask.Keys[0].Need
		g := &Give{From: "a", To: "b", ID: 1, Transfer: p.m + 1, Keys: []GiveKey{{Key: hot, Amount: need}}}
		_, err := p.b.ReceiveGive(now.Add(100*time.Millisecond), g)
		require.NoError(t, err)
		assert.Nil(t, p.b.Reask(now.Add(500*time.Millisecond)))
	})
	t.Run("a read in between", func(t *testing.T) {
		p := newTransferPair(t)
		now := p.now()
		require.NotNil(t, p.b.Pressure(now, pressure))
		// Woken by another gateway's flush: within the spacing it asks
		// nothing and the re-ask stays due, with the newer demand.
		assert.Nil(t, p.b.Pressure(now.Add(200*time.Millisecond), []Pressure{{Key: hot, DemandMilli: 90_000}}))
		assert.Equal(t, now.Add(500*time.Millisecond), p.b.ReaskAt())
		again := p.b.Reask(now.Add(500 * time.Millisecond))
		require.NotNil(t, again)
		q := newTransferPair(t)
		want := q.b.Pressure(now, []Pressure{{Key: hot, DemandMilli: 90_000}})
		require.NotNil(t, want)
		assert.Equal(t, want.Keys, again.Keys, "the need of the newer read")
		// The traffic left: a read that no longer lists the key leaves
		// nothing to repeat.
		p = newTransferPair(t)
		require.NotNil(t, p.b.Pressure(now, pressure))
		assert.Nil(t, p.b.Pressure(now.Add(300*time.Millisecond), nil))
		assert.Nil(t, p.b.Reask(now.Add(500*time.Millisecond)))
	})
	t.Run("a re-ask does not delay the next read's ask", func(t *testing.T) {
		p := newTransferPair(t)
		now := p.now()
		require.NotNil(t, p.b.Pressure(now, pressure))
		require.NotNil(t, p.b.Reask(now.Add(500*time.Millisecond)))
		assert.NotNil(t, p.b.Pressure(now.Add(600*time.Millisecond), pressure), "half an interval after the ask it repeats")
	})
	t.Run("not counted among the asks of the period, only early in a run of pressure", func(t *testing.T) {
		p := newTransferPair(t)
		now := p.now()
		var got []string
		for i := range 4 {
			at := now.Add(time.Duration(i) * time.Second)
			if p.b.Pressure(at, pressure) != nil {
				got = append(got, fmt.Sprintf("ask %d.0", i))
			}
			if p.b.Reask(at.Add(500*time.Millisecond)) != nil {
				got = append(got, fmt.Sprintf("re-ask %d.5", i))
			}
		}
		assert.Equal(t, []string{"ask 0.0", "re-ask 0.5", "ask 1.0", "re-ask 1.5", "ask 2.0"}, got,
			"three asks a period without a gift; each re-asked while the key's pressure is at most two ask intervals old")
		assert.Equal(t, int64(2), p.b.Stats().Reasks)
	})
	t.Run("a new run of pressure re-asks again", func(t *testing.T) {
		p := newTransferPair(t)
		now := p.now()
		require.NotNil(t, p.b.Pressure(now, pressure))
		p.b.Pressure(now.Add(time.Second), nil) // the pressure ended
		p.step(80_000, 0)                       // a new period
		at := p.now()
		require.NotNil(t, p.b.Pressure(at, pressure))
		assert.NotNil(t, p.b.Reask(at.Add(500*time.Millisecond)))
	})
}

// A collection between an ask and its re-ask starts a new report period:
// the re-ask still goes out, for the new period (through the binaries'
// 5 s epochs a collection 0.9 s after the shift fell there in two runs of
// three and cost a second).
func TestReaskAcrossACollection(t *testing.T) {
	p := newTransferPair(t)
	collectAt := EpochStart(p.m+2, 10*time.Second).Add(time.Second)
	askAt := collectAt.Add(-300 * time.Millisecond)
	ask := p.b.Pressure(askAt, []Pressure{{Key: hot, DemandMilli: 100_000}})
	require.NotNil(t, ask)
	p.collect(80_000, 100_000)
	again := p.b.Reask(askAt.Add(500 * time.Millisecond))
	require.NotNil(t, again)
	assert.Equal(t, ask.Epoch+1, again.Epoch, "asked for the new period")
}
