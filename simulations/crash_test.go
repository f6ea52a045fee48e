package simulations

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/rebalancer"
)

// instance is one coordinator process of a region: every message it got,
// its boundaries, and the boundaries' own serial numbers (its state).
type instance struct {
	region   int
	received []sent
	ticks    []time.Time
	serial   int // state: boundaries this instance saw
	window   time.Duration
}

func (c *instance) Receive(_ time.Time, m Message) TickResult {
	c.received = append(c.received, m.Payload.(sent))
	return TickResult{}
}

func (c *instance) Tick(now time.Time, boundary bool, _ []Usage) TickResult {
	if !boundary {
		return TickResult{}
	}
	c.serial++
	c.ticks = append(c.ticks, now)
	return TickResult{Publish: []any{sent{from: c.region, at: now, serial: c.serial}}}
}

type windowed struct{ *instance }

func (w windowed) ReplayWindow() time.Duration { return w.window }

const crashScenario = `{"name": "crash", "seed": 3, "duration_s": 120, "regions": ["a", "b"], "epoch_s": 5,
  "window_s": 30, "warmup_s": 30, "network": {"latency_ms": 10},
  "faults": [{"kind": "coordinator_down", "region": "a", "from_s": 40, "to_s": 70}],
  "policies": [{"id": "p", "scope": "global", "algorithm": "token_bucket", "rate_per_sec": 10, "burst": 10}],
  "traffic": [{"key": "k", "policies": ["p"], "rate": {"a": [[0, 5]], "b": [[0, 5]]}}]}`

// A coordinator_down outage is a crash: the region gets a new coordinator
// when it ends (nothing of the old one's state), which re-reads what a
// restarted consumer would: the messages sent within its ReplayWindow
// before the restart, or, without one, those sent since the crash.
func TestCoordinatorDownIsACrash(t *testing.T) {
	for _, tc := range []struct {
		name     string
		window   time.Duration // 0: no Replayer
		oldestAt time.Duration // oldest message the new instance re-reads, sent at or after
	}{
		{"committed offsets", 0, 40 * time.Second},
		{"lookback", 45 * time.Second, 25 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var built []*instance
			newCoord := func(info RegionInfo) (Coordinator, error) {
				c := &instance{region: info.Self, window: tc.window}
				built = append(built, c)
				if tc.window > 0 {
					return windowed{c}, nil
				}
				return c, nil
			}
			run(t, parse(t, crashScenario), Options{NewCoordinator: newCoord, ColdStart: true})
			var a []*instance
			for _, c := range built {
				if c.region == 0 {
					a = append(a, c)
				}
			}
			require.Len(t, a, 2, "region a: one coordinator, then a new one after the crash")
			first, second := a[0], a[1]
			for _, at := range first.ticks {
				assert.Less(t, at.Sub(DefaultStart), 40*time.Second, "the crashed coordinator ticks no more")
			}
			require.NotEmpty(t, second.ticks)
			assert.Equal(t, 70*time.Second, second.ticks[0].Sub(DefaultStart), "the new one ticks from the end of the outage")
			assert.Equal(t, len(second.ticks), second.serial, "the new one starts from nothing")

			// Its first deliveries are the replay: in order, the messages b
			// sent from oldestAt until the restart; then b's later ones.
			var replayed []time.Duration
			for _, m := range second.received {
				if s := m.at.Sub(DefaultStart); s < 70*time.Second {
					replayed = append(replayed, s)
				}
			}
			var want []time.Duration
			for s := 5 * time.Second; s < 70*time.Second; s += 5 * time.Second {
				if s >= tc.oldestAt {
					want = append(want, s)
				}
			}
			assert.Equal(t, want, replayed)
			assert.NotEmpty(t, second.received[len(replayed):], "and then what b sends after the restart")
		})
	}
}

// recording wraps region a's coordinator and keeps what each call asked.
type recording struct {
	Coordinator
	results *[]timedResult
}

type timedResult struct {
	at  time.Duration
	res TickResult
}

func (r recording) Receive(now time.Time, m Message) TickResult {
	res := r.Coordinator.Receive(now, m)
	*r.results = append(*r.results, timedResult{now.Sub(DefaultStart), res})
	return res
}

func (r recording) Tick(now time.Time, boundary bool, usage []Usage) TickResult {
	res := r.Coordinator.Tick(now, boundary, usage)
	*r.results = append(*r.results, timedResult{now.Sub(DefaultStart), res})
	return res
}

// While a region's store is down its coordinator's share writes fail, as
// the production driver meets them: the updates wait and are retried, and
// no report is published while any is unwritten (it would claim shares the
// store does not hold); once the store is back they are written.
func TestShareWritesFailWhileTheStoreIsDown(t *testing.T) {
	sc := parse(t, `{"name": "sd-writes", "seed": 5, "duration_s": 240, "regions": ["a", "b"], "epoch_s": 10,
	  "window_s": 60, "warmup_s": 60, "network": {"latency_ms": 20},
	  "faults": [{"kind": "store_down", "region": "a", "from_s": 100, "to_s": 160}],
	  "policies": [{"id": "p", "scope": "global", "algorithm": "token_bucket", "rate_per_sec": 100, "burst": 100}],
	  "traffic": [{"key": "k", "policies": ["p"], "rate": {"a": [[0, 80], [110, 10]], "b": [[0, 10], [110, 80]]}}]}`)
	var results []timedResult
	reb := NewRebalancerCoordinator(rebalancer.DefaultConfig())
	newCoord := func(info RegionInfo) (Coordinator, error) {
		c, err := reb(info)
		if err != nil || info.Self != 0 {
			return c, err
		}
		return recording{Coordinator: c, results: &results}, nil
	}
	run(t, sc, Options{NewCoordinator: newCoord})

	var sharesDown, sharesAfter, reportsDown, reportsBefore int
	var firstAfter time.Duration
	for _, r := range results {
		down := r.at >= 100*time.Second && r.at < 160*time.Second
		switch {
		case down:
			sharesDown += len(r.res.Shares)
			reportsDown += len(r.res.Publish)
		case r.at >= 160*time.Second:
			if len(r.res.Shares) > 0 && sharesAfter == 0 {
				firstAfter = r.at
			}
			sharesAfter += len(r.res.Shares)
		case r.at >= 40*time.Second:
			reportsBefore += len(r.res.Publish)
		}
	}
	assert.Zero(t, sharesDown, "no share is written while the store is down")
	assert.Less(t, reportsDown, 6, "reports withheld while updates are unwritten (6 epochs down)")
	assert.Equal(t, 6, reportsBefore, "one report an epoch before the outage")
	require.Positive(t, sharesAfter, "the held updates are written once the store is back")
	assert.Less(t, firstAfter, 162*time.Second, "within a retry interval of the store's return")
}
