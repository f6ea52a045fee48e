package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
)

// The transfer test's timing: production's gateway flush (1 s) and
// pressure interval (1 s, the coordinator's defaults), and 5 s epochs so
// that the warm-up (6 epochs) fits the test's minute; the shift happens
// 100 ms into an epoch, so the epoch path could grow the new region only
// at that epoch's decision, after it ends.
const (
	xferEpoch   = 5 * time.Second
	xferRate    = 30.0                      // L and B of the policy, per second
	xferDemand  = 45.0                      // requests per second of the one key, all in one region
	xferAfter   = xferEpoch + 2*time.Second // past the decision of the shift's epoch
	xferShiftIn = 100 * time.Millisecond
)

// TestBinariesTransferAfterShift deploys three regions of quotient
// coordinator + quotient gateway on loopback; one key's traffic (1.5 L) is
// all in us-east until us-east holds 90 % of L, then moves, 100 % and at
// once, to ap-south. It measures how long ap-south takes to admit 90 % of
// L over one second (issue 17's target: 3 s) and to enforce a share of
// 90 % of L, and asserts that the share gets there before the shift's
// epoch ends, that is before any epoch decision could have grown it (the
// asks and gives moved it), and the admissions within one second more.
// Throughout it asserts that the shares the three regions enforce (read
// from their Redis every 100 ms) never sum above L or B, and that the
// requests admitted by all regions in any window of 1 to 10 whole seconds
// never exceed B + L per second of the window (plus 0.5 s of L for the
// client's binning of requests into seconds).
func TestBinariesTransferAfterShift(t *testing.T) {
	inTurn(t)
	dir := t.TempDir()
	quotient := bin(t, "quotient")
	began := time.Now()
	up := upstreamURL(t)
	kafka := startBroker(t, dir)
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	policies := write("policies.json", fmt.Sprintf(`[{"id":"x","match":{"routes":["/x/*"]},"algorithm":"token_bucket","rate_per_sec":%v,"burst":%v,"scope":"global"}]`, xferRate, xferRate))
	keys := write("keys.json", `{"k-x":{"tier":"pro"}}`)
	from, to := "us-east", "ap-south"

	type region struct {
		name, admin, gateway string
		redis                *redistest.Server
		coordinator          *proc
	}
	var rs []*region
	for _, name := range regions {
		r := &region{name: name, redis: redistest.StartServer(t)}
		caddr := freeAddr(t)
		r.admin = "http://" + caddr
		r.coordinator = start(t, dir, "coordinator-"+name, quotient, nil, "coordinator",
			"--region", name, "--regions", strings.Join(regions, ","),
			"--redis", r.redis.Addr(), "--kafka", kafka, "--listen", caddr,
			"--epoch", xferEpoch.String(), "--policies", policies, "--log-level", "debug")
		rs = append(rs, r)
	}
	for _, r := range rs {
		waitHTTP(t, r.admin+"/readyz", 60*time.Second, nil)
	}
	gw := map[string]string{}
	for _, r := range rs {
		p := start(t, dir, "gateway-"+r.name, quotient, nil, "gateway",
			"--listen", "127.0.0.1:0", "--upstream", up, "--redis", r.redis.Addr(),
			"--region", r.name, "--regions", strings.Join(regions, ","),
			"--epoch", xferEpoch.String(), "--policies", policies, "--keys", keys)
		r.gateway = "http://" + p.waitLog(t, regexp.MustCompile(`listening on (\S+)`), 30*time.Second)
		waitHTTP(t, r.gateway+"/readyz", 30*time.Second, nil)
		gw[r.name] = r.gateway
	}

	// The shares of k-x every 100 ms: their sums, and when each region's
	// rate share first reached 90 % of L after the shift.
	lim := limitOf(xferRate)
	shareKey := limiter.ShareKey(limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "k-x"}, "x")
	var (
		smu        sync.Mutex
		last       = map[string]int64{}
		samples    int
		violations int
		firstViol  string
		shiftAt    atomic.Pointer[time.Time]
		shareAt    time.Time // when the new region's share first reached 90 % of L after the shift
		marks      []markSample
		lastMark   = map[string]int64{}
	)
	sctx, stopSampling := context.WithCancel(context.Background())
	var sampler sync.WaitGroup
	sampler.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
			now := time.Now()
			var sumR, sumB int64
			cur := map[string]int64{}
			ok := true
			for _, r := range rs {
				ctx, cancel := context.WithTimeout(sctx, time.Second)
				m, err := r.redis.Client().HGetAll(ctx, shareKey).Result()
				cancel()
				if err != nil {
					ok = false
					break
				}
				rate, burst := lim.def, lim.def
				if v, err := strconv.ParseInt(m["r"], 10, 64); err == nil {
					rate = v
				}
				if v, err := strconv.ParseInt(m["b"], 10, 64); err == nil {
					burst = v
				}
				sumR += rate
				sumB += burst
				cur[r.name] = rate
			}
			if !ok {
				continue // shutting down
			}
			// The gateways' pressure marks of k-x (the pressure flushes),
			// for the timeline.
			field := "x:" + limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "k-x"}.Key()
			mk := map[string]int64{}
			for _, r := range rs {
				ctx, cancel := context.WithTimeout(sctx, time.Second)
				n, err := r.redis.Client().HGet(ctx, limiter.UsagePressureKey(rebalancer.EpochOf(now, xferEpoch)), field).Int64()
				cancel()
				if err == nil {
					mk[r.name] = n
				}
			}
			smu.Lock()
			for name, n := range mk {
				if s := shiftAt.Load(); s != nil && n != lastMark[name] && now.Sub(*s) < xferAfter {
					marks = append(marks, markSample{region: name, at: now, n: n})
				}
				lastMark[name] = n
			}
			samples++
			last = cur
			if sumR > lim.l || sumB > lim.l {
				violations++
				if firstViol == "" {
					firstViol = fmt.Sprintf("at %s: r=%d b=%d milli > %d (%v)", now.Format(time.StampMilli), sumR, sumB, lim.l, cur)
				}
			}
			if s := shiftAt.Load(); s != nil && shareAt.IsZero() && cur[to]*10 >= lim.l*9 {
				shareAt = now
			}
			smu.Unlock()
		}
	})
	shares := func() map[string]int64 {
		smu.Lock()
		defer smu.Unlock()
		return last
	}

	// One paced client: xferDemand requests per second of k-x, sent to the
	// gateway of the region in target, every answer recorded.
	var target atomic.Value
	target.Store(from)
	type answer struct {
		region string
		at     time.Time
		ok     bool
	}
	var (
		amu     sync.Mutex
		answers []answer
		errs    atomic.Int64
		lastErr atomic.Value
	)
	cctx, stopClient := context.WithCancel(context.Background())
	var client sync.WaitGroup
	client.Go(func() {
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
		interval := time.Second / time.Duration(xferDemand)
		var inflight sync.WaitGroup
		defer inflight.Wait()
		for at := time.Now(); cctx.Err() == nil; at = at.Add(interval) {
			time.Sleep(time.Until(at)) // pacing: the schedule, not a wait for a result
			region := target.Load().(string)
			inflight.Go(func() {
				req, _ := http.NewRequest("GET", gw[region]+"/x/1", nil)
				req.Header.Set("X-API-Key", "k-x")
				resp, err := hc.Do(req)
				if err != nil {
					errs.Add(1)
					lastErr.Store(err.Error())
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
					errs.Add(1)
					lastErr.Store(resp.Status)
					return
				}
				amu.Lock()
				answers = append(answers, answer{region: region, at: time.Now(), ok: resp.StatusCode == http.StatusOK})
				amu.Unlock()
			})
		}
	})
	stop := func() {
		stopClient()
		client.Wait()
		stopSampling()
		sampler.Wait()
	}
	defer stop()

	// The warm-up (6 epochs), then us-east grows to 90 % of L.
	deadline := time.Now().Add(16 * xferEpoch)
	for shares()[from]*10 < lim.l*9 {
		require.True(t, time.Now().Before(deadline), "%s's share did not reach 90%% of L: %v", from, shares())
		time.Sleep(100 * time.Millisecond) // bounded poll of the sampler
	}
	t.Logf("before the shift (%v after the processes started): shares %v milli/s", time.Since(began).Round(time.Second), shares())

	// The shift: 100 ms into the next epoch, all the traffic goes to ap-south.
	at := rebalancer.EpochStart(rebalancer.EpochOf(time.Now(), xferEpoch)+1, xferEpoch).Add(xferShiftIn)
	time.Sleep(time.Until(at)) // the schedule
	shifted := time.Now()
	target.Store(to)
	shiftAt.Store(&shifted)
	epochEnd := rebalancer.EpochStart(rebalancer.EpochOf(shifted, xferEpoch)+1, xferEpoch)
	time.Sleep(time.Until(shifted.Add(xferAfter))) // the schedule: past the decision of the shift's epoch
	stop()
	for _, r := range rs {
		logMetrics(t, r.name, r.admin+"/metrics", "quotient_coordinator_transfer_", "quotient_coordinator_errors_total")
	}
	var logs []transferLog
	for _, r := range rs {
		logs = append(logs, transferLogs(t, r.name, r.coordinator.log, shifted.Add(-time.Second), shifted.Add(xferAfter))...)
	}
	sort.Slice(logs, func(i, j int) bool { return logs[i].at.Before(logs[j].at) })
	var timeline strings.Builder
	for _, l := range logs {
		fmt.Fprintf(&timeline, "\n  %+6.2fs %-8s %s", l.at.Sub(shifted).Seconds(), l.region, l.what)
	}
	smu.Lock()
	for _, m := range marks {
		fmt.Fprintf(&timeline, "\n  %+6.2fs %-8s pressure mark seen in Redis (sampled every 100 ms): %d", m.at.Sub(shifted).Seconds(), m.region, m.n)
	}
	smu.Unlock()
	t.Logf("the transfer steps around the shift (coordinators' debug log; times from the shift):%s", timeline.String())

	amu.Lock()
	defer amu.Unlock()
	smu.Lock()
	defer smu.Unlock()
	// When ap-south first admitted 90 % of L over the last second.
	var admitted []time.Time
	for _, a := range answers {
		if a.ok && a.region == to && !a.at.Before(shifted) {
			admitted = append(admitted, a.at)
		}
	}
	sort.Slice(admitted, func(i, j int) bool { return admitted[i].Before(admitted[j]) })
	var admitAt time.Time
	need := int(0.9 * xferRate)
	for i := need - 1; i < len(admitted); i++ {
		if admitted[i].Sub(admitted[i-need+1]) < time.Second {
			admitAt = admitted[i]
			break
		}
	}
	// A curve for the reader: ap-south's admitted per 500 ms after the shift.
	var curve []string
	for b := time.Duration(0); b < xferAfter; b += 500 * time.Millisecond {
		n := 0
		for _, a := range admitted {
			if d := a.Sub(shifted); d >= b && d < b+500*time.Millisecond {
				n++
			}
		}
		curve = append(curve, strconv.Itoa(n))
	}
	t.Logf("after the shift: %s's share reached 90%% of L in %v, its admissions 90%% of L over one second in %v (the shift's epoch ended %v after it); shares at the end %v; admitted per 500 ms: %s",
		to, since(shareAt, shifted), since(admitAt, shifted), epochEnd.Sub(shifted).Round(10*time.Millisecond), last, strings.Join(curve, " "))

	assert.Positive(t, samples)
	assert.Zero(t, violations, "sum of the enforced shares above L or B in %d of %d samples; first %s", violations, samples, firstViol)
	require.False(t, shareAt.IsZero(), "%s's share never reached 90%% of L", to)
	assert.True(t, shareAt.Before(epochEnd), "%s's share reached 90%% of L %v after the shift, after its epoch ended (%v): not by transfers", to, shareAt.Sub(shifted), epochEnd.Sub(shifted))
	require.False(t, admitAt.IsZero(), "%s never admitted 90%% of L in a second", to)
	assert.True(t, admitAt.Before(epochEnd.Add(time.Second)), "%s admitted 90%% of L over a second %v after the shift: later than its epoch's end plus that second", to, admitAt.Sub(shifted))
	assert.Less(t, errs.Load(), int64(len(answers)/1000+1), "requests that got neither 200 nor 429 (last: %v)", lastErr.Load())
	// A refused ask early in the shift is repeated half an interval later
	// (rebalancer.Core.Reask), not a whole pressure interval (1 s) later
	// at the next read, also across a collection.
	refused := refusedAsks(logs, to, shifted)
	if len(refused) == 0 {
		t.Logf("no ask of %s in the shift's first 1.5 s was refused by every region: the re-ask was not needed in this run", to)
	}
	for _, r := range refused {
		assert.Less(t, r.again, 900*time.Millisecond, "%s's ask at %+.2fs, refused by every region, was asked again only %v later", to, r.at.Sub(shifted).Seconds(), r.again)
	}

	// Σ admitted over any window of W whole seconds <= B + L*(W + 0.5).
	var all []time.Time
	for _, a := range answers {
		if a.ok {
			all = append(all, a.at)
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Before(all[j]) })
	worst, worstW := 0.0, 0
	for w := 1; w <= 10; w++ {
		bound := xferRate + xferRate*(float64(w)+0.5)
		j := 0
		for i := range all {
			for all[i].Sub(all[j]) >= time.Duration(w)*time.Second {
				j++
			}
			n := float64(i - j + 1)
			if n/bound > worst {
				worst, worstW = n/bound, w
			}
			if n > bound {
				assert.LessOrEqual(t, n, bound, "admitted %v in the %d s ending %s, above B + L*(W+0.5) = %v", n, w, all[i].Format(time.StampMilli), bound)
				break
			}
		}
	}
	t.Logf("admitted globally: at most %.0f%% of B + L*(W+0.5) in a window of %d s; the deployment ran %v", 100*worst, worstW, time.Since(began).Round(time.Second))
}

// markSample is a change of one region's pressure mark of the test's key.
type markSample struct {
	region string
	at     time.Time
	n      int64
}

// transferLog is one transfer step in a coordinator's debug log.
type transferLog struct {
	region string
	at     time.Time
	what   string
}

// transferLogs returns the transfer steps of a coordinator's JSON log
// (its debug lines of the pressure reads, asks and gives) between from
// and to.
func transferLogs(t *testing.T, region, path string, from, to time.Time) []transferLog {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var out []transferLog
	for _, line := range strings.Split(string(data), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil {
			continue
		}
		msg, _ := m["msg"].(string)
		if !strings.HasPrefix(msg, "rebalancer: pressure") && !strings.HasPrefix(msg, "rebalancer: ask") && !strings.HasPrefix(msg, "rebalancer: give") {
			continue
		}
		ts, _ := m["time"].(string)
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil || at.Before(from) || at.After(to) {
			continue
		}
		var attrs []string
		for k, v := range m {
			if k != "time" && k != "level" && k != "msg" {
				attrs = append(attrs, fmt.Sprintf("%s=%v", k, v))
			}
		}
		sort.Strings(attrs)
		out = append(out, transferLog{region: region, at: at, what: strings.TrimPrefix(msg, "rebalancer: ") + " " + strings.Join(attrs, " ")})
	}
	return out
}

// refusedAsk is an ask every other region answered with nothing, and the
// time until the asker's next ask (a re-ask or a new read's).
type refusedAsk struct {
	at    time.Time
	again time.Duration
}

// refusedAsks returns the asks region published within 1.5 s of its first
// pressure read after shifted that listed the key (so that their re-asks
// fall in the first two pressure intervals of the key's run of pressure,
// where a refused ask is repeated) that every other region
// answered and none gave for, with the time to the region's next ask
// (from logs, sorted by time; an ask without a next ask in the logs is
// left out). A collection between an ask and its re-ask does not cancel
// the re-ask (with this test's 5 s epochs one comes 0.9 s after the
// shift).
func refusedAsks(logs []transferLog, region string, shifted time.Time) []refusedAsk {
	var asks []time.Time
	var run time.Time
	for _, l := range logs {
		if l.region != region || l.at.Before(shifted) {
			continue
		}
		if run.IsZero() && strings.HasPrefix(l.what, "pressure read ") && attr(l.what, "keys") != "0" {
			run = l.at
		}
		if strings.HasPrefix(l.what, "ask published ") {
			asks = append(asks, l.at)
		}
	}
	var out []refusedAsk
	for i := 0; i+1 < len(asks) && !run.IsZero() && asks[i].Sub(run) <= 1500*time.Millisecond; i++ {
		answered, gave := map[string]bool{}, false
		for _, l := range logs {
			if l.region == region || l.at.Before(asks[i]) || !l.at.Before(asks[i+1]) || !strings.HasPrefix(l.what, "ask answered ") || attr(l.what, "from") != region {
				continue
			}
			answered[l.region] = true
			gave = gave || attr(l.what, "gave_keys") != "0"
		}
		if len(answered) == len(regions)-1 && !gave {
			out = append(out, refusedAsk{at: asks[i], again: asks[i+1].Sub(asks[i])})
		}
	}
	return out
}

// attr returns the value of key=value in a transferLog's what ("" if
// absent).
func attr(what, key string) string {
	for _, f := range strings.Fields(what) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}

// limitMilli holds a policy's limit in milli units and its default share.
type limitMilli struct{ l, def int64 }

func limitOf(rate float64) limitMilli {
	l := int64(rate * 1000)
	return limitMilli{l: l, def: l / int64(len(regions))}
}

func since(t, from time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Sub(from).Round(10 * time.Millisecond).String()
}
