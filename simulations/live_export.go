package simulations

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"
)

// This file is the seam the live mode (package simulations/live) uses to
// replay a scenario in real time with the same demand and to report with
// the same Recorder and writers: the request schedule, the key names and
// the per-window errors.

// Request is one request of a scenario's traffic.
type Request struct {
	// AtNs is when it arrives, in nanoseconds since t=0 (true time).
	AtNs int64
	// Traffic is the index of its entry in Scenario.Traffic.
	Traffic int
	// Key is the index of its key in that entry's KeyNames.
	Key int
	// Region is the index of its region in Scenario.Regions.
	Region int
}

// Schedule generates a scenario's requests in time order: exactly the
// arrivals (times, keys and regions) Run draws for the same scenario and
// seed, from the same per-stream generators. Not safe for concurrent use.
type Schedule struct {
	sc      *Scenario
	streams []stream
	// Per traffic entry; nil for named keys.
	keyRng, mixRng []*rand.Rand
	zipf, mix      [][]float64
	events         eventHeap
	endNs          int64
}

// NewSchedule returns the schedule of sc's traffic over [0, duration).
func NewSchedule(sc *Scenario) *Schedule {
	s := &Schedule{sc: sc, endNs: sc.DurationSec * nsPerSec}
	n := len(sc.Traffic)
	s.keyRng, s.mixRng = make([]*rand.Rand, n), make([]*rand.Rand, n)
	s.zipf, s.mix = make([][]float64, n), make([][]float64, n)
	for i := range sc.Traffic {
		tr := &sc.Traffic[i]
		if tr.Named() {
			for r, steps := range tr.Rate {
				if len(steps) > 0 {
					s.streams = append(s.streams, s.newStream(i, r, steps, tr.Arrivals))
				}
			}
			continue
		}
		s.zipf[i] = zipfCDF(tr.Count, tr.ZipfS)
		s.mix[i] = cumulative(tr.RegionMix)
		s.keyRng[i] = rng(sc.Seed, fmt.Sprintf("traffic[%d].keys", i))
		s.mixRng[i] = rng(sc.Seed, fmt.Sprintf("traffic[%d].regions", i))
		s.streams = append(s.streams, s.newStream(i, -1, tr.TotalRate, tr.Arrivals))
	}
	for i := range s.streams {
		if t := s.streams[i].next(0); t >= 0 && t < s.endNs {
			s.events.push(t, evArrival, i)
		}
	}
	return s
}

// newStream builds a stream exactly as the engine does (same generator
// purpose names), so the arrivals are the same.
func (s *Schedule) newStream(entry, region int, steps []Step, arr Arrivals) stream {
	st := stream{entry: entry, region: region, steps: steps, seg: -1, uniform: arr == Uniform,
		rng: rng(s.sc.Seed, fmt.Sprintf("traffic[%d].arrivals.%d", entry, region))}
	if steps[0].AtSec == 0 {
		st.seg = 0
	}
	return st
}

// Next returns the next request, and false when the schedule is over.
func (s *Schedule) Next() (Request, bool) {
	if len(s.events.ev) == 0 {
		return Request{}, false
	}
	ev := s.events.pop()
	st := &s.streams[ev.idx]
	req := Request{AtNs: ev.at, Traffic: st.entry, Region: st.region}
	if st.region < 0 {
		req.Key = pick(s.zipf[st.entry], s.keyRng[st.entry].Float64())
		req.Region = pick(s.mix[st.entry], s.mixRng[st.entry].Float64())
	}
	if t := st.next(ev.at); t >= 0 && t < s.endNs {
		s.events.push(t, evArrival, int(ev.idx))
	}
	return req, true
}

// KeyNames returns the keys of the entry: its Key, or KeyPrefix followed
// by 0 .. Count-1 for a generated group (the names Run uses).
func (t *Traffic) KeyNames() []string {
	if t.Named() {
		return []string{t.Key}
	}
	out := make([]string, t.Count)
	for j := range out {
		out[j] = t.KeyPrefix + strconv.Itoa(j)
	}
	return out
}

// WindowErrors returns the error of every evaluation window of Keys[i],
// (admitted - ideal) / allowance, in window order.
func (rep *Report) WindowErrors(i int) []float64 {
	t := rep.rec.keys[i]
	allowance := float64(t.allowanceMilli(rep.rec.sc.WindowSec))
	out := make([]float64, rep.rec.windows)
	for w := range out {
		out[w] = rep.windowError(i, w, allowance)
	}
	return out
}

// WindowStarts returns the first second of every evaluation window.
func (rep *Report) WindowStarts() []int64 {
	out := make([]int64, rep.rec.windows)
	for w := range out {
		out[w], _ = rep.windowBounds(w)
	}
	return out
}

// Pace replays sc's requests in real time from start, time compressed by
// scale (scenario nanoseconds per real nanosecond, at least 1): it sleeps
// until each request is due, then calls send with its due time, in order.
// It stops when the schedule ends, send returns false, or ctx ends (then it
// returns ctx's error). The live and deployed modes pace their clients with
// it. Requests due within 200 µs are sent without sleeping.
func Pace(ctx context.Context, sc *Scenario, start time.Time, scale int64, send func(due time.Time, req Request) bool) error {
	sched := NewSchedule(sc)
	scale = max(scale, 1)
	for {
		req, ok := sched.Next()
		if !ok {
			return nil
		}
		due := start.Add(time.Duration(req.AtNs / scale))
		if time.Until(due) > 200*time.Microsecond && !SleepUntil(ctx, due) {
			return ctx.Err()
		}
		if !send(due, req) {
			return ctx.Err()
		}
	}
}

// SleepUntil sleeps until t or until ctx ends; it reports whether it
// reached t with ctx still live.
func SleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}
