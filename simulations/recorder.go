package simulations

import (
	"fmt"

	"github.com/quotientlabs/quotient/limiter"
)

// Recorder counts what happened in a run, per key, policy, region and
// second, in cost units, and turns it into a Report (the ideal limiter, the
// error metric). The virtual-time engine feeds it; a live run can feed the
// same Recorder from real decisions so both modes share the report and its
// writers. Not safe for concurrent use.
type Recorder struct {
	sc        *Scenario
	regions   int
	duration  int64
	windows   int
	keys      []*trackedKey
	byKeyPol  map[keyPolicy]int
	decisions int64
}

type keyPolicy struct {
	key    string
	policy string
}

// trackedKey is one (key, policy) the run measures.
type trackedKey struct {
	key    string
	policy *limiter.Policy
	named  bool
	// secDemand is the global demand per second (the ideal's input).
	secDemand []int64
	// winDemand and winAdmitted are per region and evaluation window.
	winDemand, winAdmitted [][]int64
	// Named keys only, per region and second.
	secRegDemand, secRegAdmitted, secShareMilli [][]int64
}

// NewRecorder returns an empty Recorder for sc.
func NewRecorder(sc *Scenario) *Recorder {
	return &Recorder{
		sc:       sc,
		regions:  len(sc.Regions),
		duration: sc.DurationSec,
		windows:  int((sc.DurationSec - sc.WarmupSec) / sc.WindowSec),
		byKeyPol: map[keyPolicy]int{},
	}
}

// Track registers a (key, policy) to measure and returns its index, the
// same index for the same pair. Named keys also get per-second rows and a
// place in the plot; mixing named and generated use of one key makes it
// named.
func (r *Recorder) Track(key string, policy *limiter.Policy, named bool) int {
	kp := keyPolicy{key, policy.ID}
	if i, ok := r.byKeyPol[kp]; ok {
		if named && !r.keys[i].named {
			r.keys[i].named = true
			r.keys[i].allocNamed(r.regions, r.duration)
		}
		return i
	}
	t := &trackedKey{key: key, policy: policy, named: named, secDemand: make([]int64, r.duration)}
	t.winDemand = make([][]int64, r.regions)
	t.winAdmitted = make([][]int64, r.regions)
	for i := range t.winDemand {
		t.winDemand[i] = make([]int64, r.windows)
		t.winAdmitted[i] = make([]int64, r.windows)
	}
	if named {
		t.allocNamed(r.regions, r.duration)
	}
	r.keys = append(r.keys, t)
	r.byKeyPol[kp] = len(r.keys) - 1
	return len(r.keys) - 1
}

func (t *trackedKey) allocNamed(regions int, duration int64) {
	t.secRegDemand = make([][]int64, regions)
	t.secRegAdmitted = make([][]int64, regions)
	t.secShareMilli = make([][]int64, regions)
	for i := range t.secRegDemand {
		t.secRegDemand[i] = make([]int64, duration)
		t.secRegAdmitted[i] = make([]int64, duration)
		t.secShareMilli[i] = make([]int64, duration)
	}
}

// Lookup returns the index of a tracked (key, policy).
func (r *Recorder) Lookup(key, policyID string) (int, bool) {
	i, ok := r.byKeyPol[keyPolicy{key, policyID}]
	return i, ok
}

// Decision counts one request decision (call it once per request).
func (r *Recorder) Decision() { r.decisions++ }

// Record counts one request of cost units for tracked key k in region at
// second sec (seconds since the start, true time), admitted or not.
// Requests outside [0, duration) are ignored.
func (r *Recorder) Record(k, region int, sec int64, cost int64, admitted bool) {
	if sec < 0 || sec >= r.duration {
		return
	}
	t := r.keys[k]
	t.secDemand[sec] += cost
	w := int64(-1)
	if sec >= r.sc.WarmupSec {
		w = (sec - r.sc.WarmupSec) / r.sc.WindowSec
		if w >= int64(r.windows) {
			w = -1
		}
	}
	if w >= 0 {
		t.winDemand[region][w] += cost
	}
	if t.named {
		t.secRegDemand[region][sec] += cost
	}
	if admitted {
		if w >= 0 {
			t.winAdmitted[region][w] += cost
		}
		if t.named {
			t.secRegAdmitted[region][sec] += cost
		}
	}
}

// RecordShare notes the share region enforces for tracked key k during
// second sec: for buckets in thousandths of a cost unit per second, for
// windows in thousandths of a cost unit of the window's limit. Only named
// keys keep it.
func (r *Recorder) RecordShare(k, region int, sec int64, shareMilli int64) {
	t := r.keys[k]
	if !t.named || sec < 0 || sec >= r.duration {
		return
	}
	t.secShareMilli[region][sec] = shareMilli
}

// Named returns the indexes of the named tracked keys, in tracking order.
func (r *Recorder) Named() []int {
	var out []int
	for i, t := range r.keys {
		if t.named {
			out = append(out, i)
		}
	}
	return out
}

// idealMilli computes the ideal global limiter's admissions per second, in
// thousandths of a cost unit (see FORMAT.md: a global token bucket full at
// t=0 fed second by second, or a fixed window admitting up to its limit).
// startUnix is the Unix second of the run's start: fixed windows are aligned
// to the Unix epoch like the limiter's.
func (t *trackedKey) idealMilli(startUnix int64) []int64 {
	out := make([]int64, len(t.secDemand))
	p := t.policy
	switch p.Algorithm {
	case limiter.TokenBucket, limiter.LeakyBucket:
		rate, burst := p.RateMilli(), p.BurstMilli()
		tokens := burst
		for s, d := range t.secDemand {
			a := min(d*1000, tokens)
			out[s] = a
			tokens = min(burst, tokens-a+rate)
		}
	case limiter.FixedWindow:
		q := p.Limit * 1000
		var win, used int64 = -1, 0
		for s, d := range t.secDemand {
			if w := (startUnix + int64(s)) / p.WindowSec; w != win {
				win, used = w, 0
			}
			a := min(d*1000, q-used)
			out[s] = a
			used += a
		}
	default:
		panic(fmt.Sprintf("simulations: no ideal for algorithm %q", p.Algorithm))
	}
	return out
}

// allowanceMilli is the window allowance: L x window_s for buckets, Q for
// fixed windows, in thousandths of a cost unit.
func (t *trackedKey) allowanceMilli(windowSec int64) int64 {
	if t.policy.Algorithm == limiter.FixedWindow {
		return t.policy.Limit * 1000
	}
	return t.policy.RateMilli() * windowSec
}
