package quota

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// shiftRun drives a Core in virtual time: n Envoys on one bucket of share,
// each reporting every report (staggered), the driver ticking every
// 250 ms. Envoy 1 demands high until shiftAt, then Envoy 2 does (the
// others demand low throughout). It returns the messages per Envoy per
// second after the first TTL, and how long after the shift Envoy 2's
// assignment first reached 90 % of its new fair rate.
type shiftResult struct {
	msgsPerEnvoySec float64
	shiftTook       time.Duration
	maxSum          Amount
}

func shiftRun(t testing.TB, cfg Config, n int, report time.Duration, share Amount, high, low int64, total, shiftAt time.Duration) shiftResult {
	c, err := NewCore(cfg)
	require.NoError(t, err)
	const k = BucketKey("edge/path=%2Fapi")
	now := t0
	l := newLedger(cfg)
	l.record(now, c.SetShare(now, k, share, false))
	demand := func(e EnvoyID, at time.Duration) int64 {
		switch {
		case e == 1 && at < shiftAt, e == 2 && at >= shiftAt:
			return high
		}
		return low
	}
	// The fair rate of Envoy 2 after the shift: the others' low demand
	// met, the rest its own.
	target := share.RateMilli - int64(n-1)*low
	msgs := 0
	var res shiftResult
	res.shiftTook = -1
	lastRate := map[EnvoyID]int64{}
	step := 50 * time.Millisecond
	for at := time.Duration(0); at < total; at += step {
		now = t0.Add(at)
		var acts []Action
		for e := EnvoyID(1); e <= EnvoyID(n); e++ {
			offset := time.Duration(int64(e)*int64(report/step)/int64(n+1)) * step
			if at >= offset && (at-offset)%report == 0 {
				d := demand(e, at)
				if !c.Known(k) { // forgotten while nobody reported; the driver sets it again
					acts = append(acts, c.SetShare(now, k, share, false)...)
				}
				acts = append(acts, c.Report(now, e, k, Usage{Allowed: uint64(d * int64(report/time.Millisecond) / 1_000_000), Elapsed: report})...)
			}
		}
		if at%(250*time.Millisecond) == 0 {
			acts = append(acts, c.Tick(now)...)
		}
		l.record(now, acts)
		for _, a := range acts {
			lastRate[a.Envoy] = a.Amount.RateMilli
			if at >= cfg.TTL {
				msgs++
			}
		}
		if sum := l.total(now); !sum.fits(res.maxSum) {
			res.maxSum = maxAmount(res.maxSum, sum)
		}
		if at >= shiftAt && res.shiftTook < 0 && lastRate[2]*10 >= target*9 {
			res.shiftTook = at - shiftAt
		}
	}
	res.msgsPerEnvoySec = float64(msgs) / float64(n) / (total - cfg.TTL).Seconds()
	return res
}

// TestTrafficShiftReachesNewSplit: when the traffic moves from one Envoy
// to another, the second reaches its new fair rate within TTL + InFlight
// (the first's larger assignment must run out) plus one report and one
// tick, and the Envoys never hold more than the share meanwhile.
func TestTrafficShiftReachesNewSplit(t *testing.T) {
	cfg := DefaultConfig()
	share := Amount{RateMilli: 100_000, BurstMilli: 100_000}
	res := shiftRun(t, cfg, 3, time.Second, share, 200_000, 5_000, 60*time.Second, 30*time.Second)
	require.GreaterOrEqual(t, res.shiftTook, time.Duration(0), "envoy 2 never reached its new rate")
	assert.LessOrEqual(t, res.shiftTook, cfg.TTL+cfg.InFlight+time.Second+250*time.Millisecond)
	assert.True(t, res.maxSum.fits(share), "max %+v", res.maxSum)
}

// BenchmarkTrafficShift reports, in virtual time, the messages the server
// sends per Envoy per second under steady and shifting demand and the time
// from a traffic shift to the new split, for the default TTL and two
// reporting intervals (go test -run '^$' -bench TrafficShift ./rls/quota/).
func BenchmarkTrafficShift(b *testing.B) {
	for _, report := range []time.Duration{time.Second, 2 * time.Second} {
		for _, n := range []int{3, 30} {
			b.Run(report.String()+"/"+string(rune('0'+n/10))+string(rune('0'+n%10))+"envoys", func(b *testing.B) {
				var res shiftResult
				for range b.N {
					res = shiftRun(b, DefaultConfig(), n, report, Amount{RateMilli: 1_000_000, BurstMilli: 1_000_000}, 2_000_000, 5_000, 120*time.Second, 60*time.Second)
				}
				b.ReportMetric(res.msgsPerEnvoySec, "msgs/envoy/s")
				b.ReportMetric(res.shiftTook.Seconds(), "shift-s")
			})
		}
	}
}
