package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/kafkautil"
	"github.com/quotientlabs/quotient/internal/redistest"
	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
	"github.com/quotientlabs/quotient/rebalancer/kafkabus"
)

// TestBinariesLeaderKilled runs region "a" as two coordinator replicas
// (memberlist gossip on loopback, one Redis) beside region "b", reads
// every usage report from the broker, kills the leading replica of "a"
// with SIGKILL and measures how long the region goes without a report,
// which of its epochs were never reported (skipped) and which were
// reported twice with different contents (doubled: target 0).
func TestBinariesLeaderKilled(t *testing.T) {
	inTurn(t)
	dir := t.TempDir()
	quotient := bin(t, "quotient")
	kafka := startBroker(t, dir)
	policies := filepath.Join(dir, "policies.json")
	require.NoError(t, os.WriteFile(policies, []byte(`[{"id":"g","algorithm":"token_bucket","rate_per_sec":30,"burst":30,"scope":"global"}]`), 0o600))

	// Every report of the topic, by region and epoch (seq, first arrival).
	type seen struct {
		seqs  map[int64]bool
		first time.Time
	}
	var mu sync.Mutex
	reports := map[string]map[int64]*seen{"a": {}, "b": {}}
	cl, err := kafkautil.New(kafkautil.Config{Brokers: []string{kafka}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Close() })
	bcfg := kafkabus.DefaultConfig()
	bcfg.Lookback = time.Hour
	bus, err := kafkabus.New(cl, bcfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = bus.Close() })
	rctx, stopReading := context.WithCancel(context.Background())
	var reader sync.WaitGroup
	reader.Go(func() {
		_ = bus.Run(rctx, func(r *quotientv1.UsageReport) {
			mu.Lock()
			defer mu.Unlock()
			byEpoch := reports[r.GetRegion()]
			if byEpoch == nil {
				return
			}
			s := byEpoch[r.GetEpoch()]
			if s == nil {
				s = &seen{seqs: map[int64]bool{}, first: time.Now()}
				byEpoch[r.GetEpoch()] = s
			}
			s.seqs[r.GetSeq()] = true
		})
	})
	t.Cleanup(func() { stopReading(); reader.Wait() })

	type replica struct {
		name, http string
		p          *proc
	}
	ra, rb := redistest.StartServer(t), redistest.StartServer(t)
	g1, g2 := freeAddr(t), freeAddr(t)
	var as []*replica
	for i, name := range []string{"a-1", "a-2"} {
		r := &replica{name: name, http: freeAddr(t)}
		args := []string{"coordinator", "--region", "a", "--regions", "a,b", "--redis", ra.Addr(), "--kafka", kafka,
			"--listen", r.http, "--epoch", epoch.String(), "--policies", policies, "--node-name", name,
			"--gossip-bind", []string{g1, g2}[i]}
		if i == 1 {
			args = append(args, "--gossip-seeds", g1)
		}
		r.p = start(t, dir, "coordinator-"+name, quotient, nil, args...)
		as = append(as, r)
	}
	bAddr := freeAddr(t)
	start(t, dir, "coordinator-b", quotient, nil, "coordinator", "--region", "b", "--regions", "a,b", "--redis", rb.Addr(),
		"--kafka", kafka, "--listen", bAddr, "--epoch", epoch.String(), "--policies", policies)

	// Both regions report steadily (after the warm-up of a cold start).
	lastOf := func(region string) (int64, time.Time) {
		mu.Lock()
		defer mu.Unlock()
		var last int64 = -1
		var at time.Time
		for e, s := range reports[region] {
			if e > last {
				last, at = e, s.first
			}
		}
		return last, at
	}
	waitFor := func(what string, timeout time.Duration, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for !ok() {
			require.True(t, time.Now().Before(deadline), "no %s within %v", what, timeout)
			time.Sleep(50 * time.Millisecond) // bounded poll of real processes
		}
	}
	firstA := int64(-1)
	waitFor("steady reports of region a", 60*time.Second, func() bool {
		e, _ := lastOf("a")
		if firstA < 0 && e >= 0 {
			firstA = e
		}
		return firstA >= 0 && e >= firstA+3
	})

	// Both replicas are one gossip cluster (they started together, so the
	// second may have joined the first a moment later).
	waitFor("one gossip cluster of region a", 30*time.Second, func() bool {
		for _, r := range as {
			var h struct{ Leader string }
			resp, err := http.Get("http://" + r.http + "/healthz")
			if err != nil {
				return false
			}
			_ = json.NewDecoder(resp.Body).Decode(&h)
			_ = resp.Body.Close()
			if h.Leader != "a-1" {
				return false
			}
		}
		return true
	})

	// Kill the leader.
	var leader *replica
	for _, r := range as {
		var h struct{ Role string }
		resp, err := http.Get("http://" + r.http + "/healthz")
		if err != nil {
			continue
		}
		_ = json.NewDecoder(resp.Body).Decode(&h)
		_ = resp.Body.Close()
		if h.Role == "leader" {
			leader = r
		}
	}
	require.NotNil(t, leader, "one replica of region a leads")
	before, _ := lastOf("a")
	killed := time.Now()
	require.NoError(t, leader.p.cmd.Process.Signal(syscall.SIGKILL))
	var after int64
	var afterAt time.Time
	waitFor("report of region a after the kill", 60*time.Second, func() bool {
		after, afterAt = lastOf("a")
		return after > before
	})
	gap := afterAt.Sub(killed)
	// Let the new leader run a few epochs, then count.
	waitFor("three more epochs of region a", 30*time.Second, func() bool { e, _ := lastOf("a"); return e >= after+3 })
	last, _ := lastOf("a")
	mu.Lock()
	var skipped, doubled []int64
	for e := firstA; e <= last; e++ {
		s := reports["a"][e]
		switch {
		case s == nil:
			skipped = append(skipped, e)
		case len(s.seqs) > 1:
			doubled = append(doubled, e)
		}
	}
	mu.Unlock()
	sort.Slice(skipped, func(i, j int) bool { return skipped[i] < skipped[j] })
	t.Logf("leader %s killed after epoch %d: next report (epoch %d) %v later; epochs %d..%d: skipped %v, doubled %v",
		leader.name, before, after, gap.Round(10*time.Millisecond), firstA, last, skipped, doubled)
	assert.Empty(t, doubled, "an epoch reported twice with different contents")
	assert.Less(t, gap, 30*time.Second, "the region was silent too long")
}
