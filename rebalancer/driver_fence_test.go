package rebalancer

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/shares"
)

// memFence is the region's epoch fence in memory (membership.Fence in
// Redis): claims succeed once, in increasing order. It records who claimed
// every epoch.
type memFence struct {
	mu     sync.Mutex
	last   int64
	any    bool
	claims []claim
	fail   bool
}

type claim struct {
	epoch int64
	by    string
}

// replica is the Fence one replica sees.
type replica struct {
	f    *memFence
	name string
}

var _ Fence = replica{}

func (r replica) Last(context.Context) (int64, bool, error) {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	if r.f.fail {
		return 0, false, errors.New("fake: fence unavailable")
	}
	return r.f.last, r.f.any, nil
}

func (r replica) Claim(_ context.Context, e int64) (bool, error) {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	if r.f.fail {
		return false, errors.New("fake: fence unavailable")
	}
	if r.f.any && e <= r.f.last {
		return false, nil
	}
	r.f.last, r.f.any = e, true
	r.f.claims = append(r.f.claims, claim{e, r.name})
	return true, nil
}

func (f *memFence) snapshot() []claim {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]claim(nil), f.claims...)
}

// recordingBus records the epochs of the reports published through it.
type recordingBus struct {
	Bus
	mu  sync.Mutex
	out []claim
	by  string
}

func (b *recordingBus) Publish(ctx context.Context, r *Report) error {
	b.mu.Lock()
	b.out = append(b.out, claim{r.Epoch, b.by})
	b.mu.Unlock()
	return b.Bus.Publish(ctx, r)
}

// TestDriverFenceLeaderChange: region a has two replicas sharing one fence
// (and one store and bus, as replicas share the region's Redis and Kafka);
// region b one driver. Replica a1 leads, then dies; a2 starts 1.5 epochs
// later with a fresh Core. a2 resumes at the epoch after a1's last claim,
// catching up on the epochs that ended meanwhile, so the region's claimed
// (collected) epochs run without gap or duplicate. The published reports
// have no duplicate epoch either; the only epochs without a report are
// each Core's warm-up, which the Core requires (see the package doc). The
// enforced sum stays within the limit throughout.
func TestDriverFenceLeaderChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := shares.Limit{RateMilli: 300_000, BurstMilli: 300_000, Regions: 2}
		k := Key{PolicyID: "p", Subject: "k"}
		w := newWorld(t, []string{"a", "b"}, lim, []Key{k})
		w.demand = func(string, int64, Key) int64 { return 200 }
		cfg := driverTestConfig()
		fence := &memFence{}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()

		pubs := &recordingBus{Bus: w.ports["a"]}
		start := func(name string) (context.CancelFunc, chan error) {
			c := cfg
			c.Region, c.Regions = name[:1], w.regions
			core, err := New(c, PolicyMap{"p": lim})
			require.NoError(t, err)
			dc := DriverConfig{Usage: &fakeSource{w: w, region: c.Region}, Shares: &fakeSink{w: w, region: c.Region}, Bus: w.ports[c.Region]}
			if c.Region == "a" {
				dc.Bus, dc.Fence = &namedBus{pubs, name}, replica{fence, name}
			}
			d, err := NewDriver(core, dc)
			require.NoError(t, err)
			dctx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- d.Run(dctx) }()
			return stop, done
		}
		_, bDone := start("b")
		stopA1, a1Done := start("a1")
		w.watch(10*time.Second, k)
		stopA1() // a1 dies; failure detection takes 1.5 epochs
		assert.ErrorIs(t, <-a1Done, context.Canceled)
		w.watch(1500*time.Millisecond, k)
		a2Start := EpochOf(time.Now(), cfg.Epoch)
		stopA2, a2Done := start("a2")
		w.watch(12*time.Second, k)
		stopA2()
		assert.ErrorIs(t, <-a2Done, context.Canceled)
		cancel()
		assert.ErrorIs(t, <-bDone, context.Canceled)

		claims := fence.snapshot()
		require.NotEmpty(t, claims)
		by := map[string][]int64{}
		for i, c := range claims {
			by[c.by] = append(by[c.by], c.epoch)
			if i > 0 {
				require.Equal(t, claims[i-1].epoch+1, c.epoch, "claimed epochs are consecutive: %v", claims)
			}
		}
		require.Len(t, by, 2)
		a2First := by["a2"][0]
		assert.Equal(t, by["a1"][len(by["a1"])-1]+1, a2First, "a2 resumes after a1's last claim")
		assert.Less(t, a2First, a2Start-1, "a2 caught up on the epochs that ended before it started")

		pubs.mu.Lock()
		out := append([]claim(nil), pubs.out...)
		pubs.mu.Unlock()
		seen := map[int64]bool{}
		for _, p := range out {
			require.False(t, seen[p.epoch], "epoch %d published twice: %v", p.epoch, out)
			seen[p.epoch] = true
		}
		warm := cfg.WarmupEpochs
		if warm == 0 {
			warm = cfg.SilenceEpochs + 1
		}
		for _, c := range claims {
			first := by[c.by][0]
			inWarmup := c.epoch < first+warm
			assert.Equal(t, !inWarmup, seen[c.epoch], "epoch %d claimed by %s: published iff past its Core's warm-up", c.epoch, c.by)
		}
		assert.Positive(t, w.checks)
		t.Logf("claims by replica %v; %d reports published", by, len(out))
	})
}

// namedBus tags the publications of one replica.
type namedBus struct {
	b    *recordingBus
	name string
}

func (n *namedBus) Publish(ctx context.Context, r *Report) error {
	n.b.mu.Lock()
	n.b.by = n.name
	n.b.mu.Unlock()
	return n.b.Publish(ctx, r)
}

func (n *namedBus) Receive(ctx context.Context) (*Report, error) { return n.b.Receive(ctx) }

// TestDriverFenceTwoLeaders: two replicas that both believe they lead
// (views disagree) run at once on one fence; one of them is fenced out
// (Run returns ErrFenced) and no epoch is claimed twice. A fence that
// cannot be read at start fails Run; a claim that fails is retried.
func TestDriverFenceTwoLeaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := shares.Limit{RateMilli: 300_000, BurstMilli: 300_000, Regions: 1}
		k := Key{PolicyID: "p", Subject: "k"}
		w := newWorld(t, []string{"a"}, lim, []Key{k})
		w.demand = func(string, int64, Key) int64 { return 10 }
		fence := &memFence{}
		newDriver := func(name string) *Driver {
			c := driverTestConfig()
			c.Region, c.Regions = "a", w.regions
			core, err := New(c, PolicyMap{"p": lim})
			require.NoError(t, err)
			d, err := NewDriver(core, DriverConfig{Usage: &fakeSource{w: w, region: "a"}, Shares: &fakeSink{w: w, region: "a"}, Bus: w.ports["a"], Fence: replica{fence, name}})
			require.NoError(t, err)
			return d
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		errs := make(chan error, 2)
		for _, n := range []string{"x", "y"} {
			d := newDriver(n)
			go func() { errs <- d.Run(ctx) }()
		}
		first := <-errs
		assert.ErrorIs(t, first, ErrFenced)
		w.watch(3*time.Second, k)
		cancel()
		assert.ErrorIs(t, <-errs, context.Canceled, "the other replica keeps running")
		claims := fence.snapshot()
		for i := 1; i < len(claims); i++ {
			assert.Equal(t, claims[i-1].epoch+1, claims[i].epoch)
		}

		// Fence down at start: Run fails at once. Down later: the claim is
		// retried and the epoch collected once the fence answers.
		fence.mu.Lock()
		fence.fail = true
		fence.mu.Unlock()
		assert.ErrorContains(t, newDriver("z").Run(t.Context()), "last claimed epoch")
		fence.mu.Lock()
		fence.fail = false
		fence.mu.Unlock()
		d := newDriver("z")
		ctx2, cancel2 := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx2) }()
		synctest.Wait()
		fence.mu.Lock()
		fence.fail = true
		fence.mu.Unlock()
		time.Sleep(2500 * time.Millisecond) // virtual time: claims fail
		fence.mu.Lock()
		fence.fail = false
		fence.mu.Unlock()
		time.Sleep(2 * time.Second) // virtual time: claims succeed again
		cancel2()
		assert.ErrorIs(t, <-done, context.Canceled)
		after := fence.snapshot()[len(claims):]
		require.NotEmpty(t, after)
		for i, c := range after {
			assert.Equal(t, "z", c.by)
			if i > 0 {
				assert.Equal(t, after[i-1].epoch+1, c.epoch, "a failed claim is retried, not skipped")
			} else {
				assert.Equal(t, claims[len(claims)-1].epoch+1, c.epoch)
			}
		}
	})
}
