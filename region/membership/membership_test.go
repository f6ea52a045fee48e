package membership_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/region/membership"
)

func TestLeaderOf(t *testing.T) {
	assert.Equal(t, "", membership.LeaderOf(nil))
	assert.Equal(t, "coord-a", membership.LeaderOf([]string{"coord-c", "coord-a", "coord-b"}))
}

// TestFence: an epoch is claimed once, and never below the last claim.
func TestFence(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rs := redistest.StartServer(t)
	f := membership.NewFence(rs.Client(), "eu")
	_, ok, err := f.Last(ctx)
	require.NoError(t, err)
	assert.False(t, ok)
	for _, c := range []struct {
		epoch int64
		owner string
		want  bool
	}{{10, "a", true}, {10, "b", false}, {9, "b", false}, {11, "b", true}, {11, "a", false}} {
		got, err := f.Claim(ctx, c.epoch, c.owner)
		require.NoError(t, err)
		assert.Equal(t, c.want, got, "claim %d by %s", c.epoch, c.owner)
	}
	last, ok, err := f.Last(ctx)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, int64(11), last)
	assert.True(t, mustClaim(t, membership.NewFence(rs.Client(), "us"), 1), "regions have separate fences")
}

func mustClaim(t *testing.T, f *membership.Fence, e int64) bool {
	ok, err := f.Claim(context.Background(), e, "x")
	require.NoError(t, err)
	return ok
}

// report is one published usage report.
type report struct {
	epoch int64
	by    string
}

type sink struct {
	mu   sync.Mutex
	reps []report
}

func (s *sink) publish(e int64, by string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reps = append(s.reps, report{e, by})
}

func (s *sink) snapshot() []report {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]report(nil), s.reps...)
}

// epochLoop is the leader-only epoch loop as the coordinator runs it:
// resume after the last claimed epoch, claim each completed epoch in
// order, publish it only when the claim succeeds.
func epochLoop(f *membership.Fence, name string, epoch time.Duration, out *sink) func(context.Context) error {
	return func(ctx context.Context) error {
		epochOf := func(t time.Time) int64 { return t.UnixNano() / int64(epoch) }
		next := epochOf(time.Now()) - 1
		if last, ok, err := f.Last(ctx); err != nil {
			return err
		} else if ok {
			next = last + 1
		}
		for {
			for done := epochOf(time.Now()) - 1; next <= done; next++ {
				ok, err := f.Claim(ctx, next, name)
				if err != nil {
					return err
				}
				if ok {
					out.publish(next, name)
				}
			}
			wait := time.Until(time.Unix(0, (epochOf(time.Now())+1)*int64(epoch)))
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
		}
	}
}

// TestLeaderKill: three replicas on loopback with memberlist's LAN failure
// detection form one cluster with exactly one leader; the leader is killed
// (no Leave) while the epoch loop publishes; a follower takes over within
// the failure-detection bound and the region's reports have no gap and no
// duplicate epoch.
func TestLeaderKill(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rs := redistest.StartServer(t)
	const epoch = 200 * time.Millisecond
	out := &sink{}
	names := []string{"coord-a", "coord-b", "coord-c"}
	members := map[string]*membership.Member{}
	stops := map[string]context.CancelFunc{}
	var wg sync.WaitGroup
	var seed []string
	for _, n := range names {
		cfg := membership.DefaultConfig(n)
		cfg.BindAddr, cfg.BindPort, cfg.Seeds = "127.0.0.1", 0, seed
		m, err := membership.Join(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = m.Shutdown() })
		members[n] = m
		seed = []string{members[names[0]].Addr()}
		mctx, stop := context.WithCancel(ctx)
		stops[n] = stop
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = m.RunWhileLeader(mctx, 50*time.Millisecond, epochLoop(membership.NewFence(rs.Client(), "eu"), n, epoch, out), func(err error) { t.Errorf("%s: %v", n, err) })
		}()
	}
	leaders := func(alive ...string) []string {
		var l []string
		for _, n := range alive {
			if members[n].IsLeader() {
				l = append(l, n)
			}
		}
		return l
	}
	agreed := func(alive ...string) bool {
		for _, n := range alive {
			if len(members[n].Alive()) != len(alive) {
				return false
			}
		}
		return len(leaders(alive...)) == 1
	}
	waitUntil(t, 30*time.Second, "three members, one leader", func() bool { return agreed(names...) })
	require.Equal(t, []string{"coord-a"}, leaders(names...))
	waitUntil(t, 10*time.Second, "reports under the first leader", func() bool { return len(out.snapshot()) >= 5 })

	// Kill the leader: its loop and its gossip stop at once, no goodbye.
	killed := time.Now()
	stops["coord-a"]()
	require.NoError(t, members["coord-a"].Shutdown())
	took := waitUntil(t, 30*time.Second, "a follower takes over", func() bool { return len(leaders("coord-b", "coord-c")) == 1 && agreed("coord-b", "coord-c") })
	t.Logf("failure detection and takeover: %v (probe %v, suspicion mult %d, 3 members)", took.Round(10*time.Millisecond), membership.DefaultConfig("x").ProbeInterval, membership.DefaultConfig("x").SuspicionMult)
	assert.Less(t, took, 10*time.Second, "LAN failure detection bound")
	assert.Equal(t, []string{"coord-b"}, leaders("coord-b", "coord-c"))
	resumeAfter := time.Since(killed)
	waitUntil(t, 10*time.Second, "reports under the new leader", func() bool {
		reps := out.snapshot()
		return reps[len(reps)-1].by == "coord-b" && time.Since(killed) > resumeAfter+5*epoch
	})
	for _, n := range names[1:] {
		stops[n]()
	}
	wg.Wait()

	reps := out.snapshot()
	by := map[string]int{}
	for i, r := range reps {
		by[r.by]++
		if i > 0 {
			require.Equal(t, reps[i-1].epoch+1, r.epoch, "epoch %d follows %d: no gap, no duplicate (%v)", r.epoch, reps[i-1].epoch, fmt.Sprint(reps))
		}
	}
	assert.Positive(t, by["coord-a"])
	assert.Positive(t, by["coord-b"])
	assert.Zero(t, by["coord-c"])
	t.Logf("%d consecutive epochs: %v", len(reps), by)
}

func waitUntil(t *testing.T, bound time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > bound {
			t.Fatalf("%s: not within %v", what, bound)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// TestJoinBeforeTheSeedIsUp: a replica whose seed is not up yet starts
// alone instead of failing, and has joined the seed within seconds of the
// seed starting (replicas of a region start together; one that exited
// left the region a replica short for good).
func TestJoinBeforeTheSeedIsUp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())

	cfg := membership.DefaultConfig("coord-b")
	cfg.BindAddr, cfg.BindPort, cfg.Seeds = "127.0.0.1", 0, []string{fmt.Sprintf("127.0.0.1:%d", port)}
	b, err := membership.Join(cfg)
	require.NoError(t, err, "no seed answering is not an error")
	t.Cleanup(func() { _ = b.Shutdown() })
	assert.Equal(t, []string{"coord-b"}, b.Alive())

	acfg := membership.DefaultConfig("coord-a")
	acfg.BindAddr, acfg.BindPort = "127.0.0.1", port
	a, err := membership.Join(acfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Shutdown() })
	deadline := time.Now().Add(15 * time.Second)
	for len(b.Alive()) < 2 || len(a.Alive()) < 2 {
		require.True(t, time.Now().Before(deadline), "b never joined a: b sees %v, a sees %v", b.Alive(), a.Alive())
		time.Sleep(50 * time.Millisecond) // bounded poll of real gossip
	}
	assert.Equal(t, "coord-a", b.Leader())
}
