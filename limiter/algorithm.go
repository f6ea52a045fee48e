package limiter

import (
	"math"

	"github.com/quotientlabs/quotient/internal/calendar"
)

// This file is the reference for the algorithms: the in-memory store runs it
// and the Lua script in script.lua mirrors it line for line, with the same
// integer state and the same double-precision divisions in the same order,
// so that both give identical decisions (see TestDifferential). Any change
// here must be made there too.
//
// Units: buckets work in microseconds and nano-tokens, with rates in
// milli-tokens per second, which is exactly nano-tokens per microsecond;
// windows work in milliseconds and cost units.
//
// Fixed windows are aligned to the Unix epoch (start = now - now mod w), or,
// for monthly policies, are the UTC calendar months: start and end come
// from calendar.MonthAt, whose integer days-from-civil arithmetic the script
// repeats in doubles (exact: every value is an integer below 2^53 and every
// division is floored), so both sides cut the same months.
//
// A bucket's state is the tokens it held at a time: T nano-tokens (free
// capacity, for a leaky bucket) at the start of millisecond t. At time now
// it holds T + (now - t) x rate, at most its capacity and at least zero;
// an admission takes cost x 10^9 nano-tokens. The rate and burst are those
// in force at the decision (a share, an override, an edited policy), so a
// change of either carries the tokens that were left: a bucket emptied at
// 500/s and cut to 50/s at the same instant holds nothing, and refills at
// 50/s from there; a smaller burst clamps, a larger one adds nothing. (The
// store cannot know when between two admissions a rate changed: the rate
// read at a decision applies since the last admission, the last write.)
// The state is kept at a millisecond, not the decision's microsecond, so
// that it packs into 12 bytes in Redis (see script.lua): T is moved back
// to the millisecond's start at the rate of the write, and a decision in
// the same millisecond at another rate is off by less than one millisecond
// of refill.
//
// Rate 0 (only a share record can say so: the parser wants at least 0.001
// tokens/s) means no refill: the bucket keeps what it holds, and a cost it
// cannot cover is rejected with retry never (Decision Never), whatever the
// burst. A leaky bucket at rate 0 forwards what it admits at once (its
// queue never drains, so there is no delay to wait). Burst 0 admits only
// peeks. Share records are clamped to the parser's bounds (rate 0 to
// MaxRatePerSec, burst 0 to MaxBurst).
//
// A bucket's key expires when it would be full again at the rate of its
// last write, plus one second, so an expired key is exactly a full bucket
// while the rate stays; a rate cut while the bucket is idle holds only
// until then. At rate 0 a bucket is never full again; its key then lives
// (and its reset says) as long as it would take to fill at the policy's
// own rate (rate_per_sec; for a global policy its default share,
// rate_per_sec / regions), after which it is full.

// Bucket state bounds: share records are clamped to these (milli-units).
const (
	maxRateMilli  = MaxRatePerSec * 1000
	maxBurstMilli = MaxBurst * 1000
)

const (
	nano         = 1_000_000_000 // nano-tokens per token
	nanoPerMilli = 1_000_000     // nano-tokens per milli-token
)

// op is one policy's part of one store call.
type op struct {
	algo     Algorithm
	enforce  bool
	global   bool   // read the region's share (buckets) before deciding
	cost     int64  // cost units; 0 peeks
	rate     int64  // buckets: milli-tokens per second (default share when global)
	burst    int64  // buckets: milli-tokens (default share when global)
	limit    int64  // windows: cost units per window
	windowMs int64  // windows: window length; 0 for a fixed window: the UTC calendar month
	policy   string // policy id
	region   string // this region's name (global fixed windows)
}

// tag names the op's state in keys: the algorithm's tag, or "fg" for a
// global (replicated) fixed window, whose state differs.
func (o *op) tag() string {
	if o.algo == FixedWindow && o.global {
		return "fg"
	}
	return o.algo.tag()
}

// monthly reports whether o is a fixed window over UTC calendar months.
// opFor passes WindowSec x 1000 as windowMs, which Validate leaves 0
// exactly for monthly policies; the script receives the same 0.
func (o *op) monthly() bool { return o.algo == FixedWindow && o.windowMs == 0 }

// fixedStart is the start (ms) of o's fixed window that contains nowMs.
func fixedStart(o *op, nowMs int64) int64 {
	if o.monthly() {
		start, _ := calendar.MonthAt(nowMs)
		return start
	}
	return nowMs - nowMs%o.windowMs
}

// fixedEnd is the end (ms) of o's fixed window that starts at startMs: the
// next month's start for monthly windows.
func fixedEnd(o *op, startMs int64) int64 {
	if o.monthly() {
		_, end := calendar.MonthAt(startMs)
		return end
	}
	return startMs + o.windowMs
}

// replicated reports whether o is a global fixed window: per-region counts
// in one hash, decided on their sum.
func (o *op) replicated() bool { return o.algo == FixedWindow && o.global }

// regionCount is one region's admitted count in a replicated window.
type regionCount struct {
	region string
	count  int64
}

// logEntry is one admitted request of a sliding window log.
type logEntry struct {
	ts   int64
	cost int64
}

// state is the stored state of one policy for one subject. Field use by
// algorithm (and the Redis hash fields that hold them):
//
//	token_bucket:           a = nano-tokens at ms b, b = ms       (12 bytes, bucketPack)
//	leaky_bucket:           a = free nano-tokens at ms b, b = ms  (12 bytes, bucketPack)
//	fixed_window:           a = window start ms, b = count         (a string "a:b")
//	sliding_window_counter: a = window start ms, b = current count,
//	                        c = previous count                     (a string "a:b:c")
//	sliding_window_log:     log (a Redis list of "ts:cost")
//	fixed_window, global:   a = window start ms, counts per region,
//	                        cap = this region's cap ("w", "n:<region>", "cap")
type state struct {
	a, b, c int64
	// expireMs is the absolute time of the key's TTL. (It is next to a
	// and b, the whole state of a bucket, so that a bucket's decision
	// reads one cache line of the memory store.)
	expireMs int64
	capv     int64 // -1: no cap
	log      []logEntry
	counts   []regionCount // sorted by region
}

// countOf is region's count in a replicated window.
func (s *state) countOf(region string) int64 {
	for _, rc := range s.counts {
		if rc.region == region {
			return rc.count
		}
	}
	return 0
}

// total is the sum over regions of a replicated window.
func (s *state) total() int64 {
	var t int64
	for _, rc := range s.counts {
		t += rc.count
	}
	return t
}

// withCount returns counts with region's count set to n (a new slice).
func withCount(counts []regionCount, region string, n int64) []regionCount {
	out := make([]regionCount, 0, len(counts)+1)
	done := false
	for _, rc := range counts {
		switch {
		case rc.region == region:
			out = append(out, regionCount{region, n})
			done = true
		case !done && rc.region > region:
			out = append(out, regionCount{region, n}, rc)
			done = true
		default:
			out = append(out, rc)
		}
	}
	if !done {
		out = append(out, regionCount{region, n})
	}
	return out
}

// result is one policy's answer.
type result struct {
	allowed   bool  // this policy admits the request
	remaining int64 // cost units left after this request (if admitted)
	resetMs   int64 // until the policy is back to full quota
	retryMs   int64 // when rejected: until this cost could be admitted; -1 never
	delayMs   int64 // leaky bucket: how long to hold an admitted request
	skipped   bool  // not evaluated: an earlier subject of the request rejected (RedisStore across cluster nodes)
}

// ceilDiv is math.ceil(x / y) in double arithmetic, exactly as Lua computes
// it.
func ceilDiv(x, y int64) int64 {
	return int64(math.Ceil(float64(x) / float64(y)))
}

// floorDiv is math.floor(x / y) in double arithmetic, as Lua computes it.
func floorDiv(x, y int64) int64 {
	return int64(math.Floor(float64(x) / float64(y)))
}

// bucketLimits clamps a bucket's rate and burst (milli-units; a share
// record may hold anything) to what the parser allows, 0 included.
func bucketLimits(rate, burst int64) (int64, int64) {
	return min(max(rate, 0), maxRateMilli), min(max(burst, 0), maxBurstMilli)
}

// bucketTokens is what the bucket state s holds at nowUs at rate, clamped
// to [0, capN] (nano-tokens). It is computed in doubles, as Lua does: every
// term below 2^53 is exact, and a sum that is not is far above any
// capacity and clamps to it.
func bucketTokens(s *state, nowUs, rate, capN int64) int64 {
	t := float64(s.a) + float64(float64(nowUs-s.b*1000)*float64(rate))
	if t > float64(capN) {
		return capN
	}
	if t < 0 {
		return 0
	}
	return int64(t)
}

// bucketState is the state of a bucket that holds tokens at nowUs: the
// tokens at the start of nowUs's millisecond (a: nano-tokens), at rate
// (which may be negative, down to -999 µs of refill), and that
// millisecond (b).
func bucketState(tokens, nowUs, rate int64) (a, b int64) {
	ms := floorDiv(nowUs, 1000)
	return tokens - (nowUs-ms*1000)*rate, ms
}

// advance moves st (nil when the key does not exist) to time nowUs without
// consuming, and returns the new state. rate and burst are the effective
// bucket parameters (the share, for global policies).
func advance(o *op, st *state, nowUs, rate, burst int64) state {
	var s state
	advanceTo(&s, o, st, nowUs, rate, burst)
	return s
}

// advanceTo is advance writing the new state into *dst (which must not
// be st): the memory store's hot path, which copies no 88-byte state.
func advanceTo(dst *state, o *op, st *state, nowUs, rate, burst int64) {
	if o.algo.isBucket() {
		rate, burst = bucketLimits(rate, burst)
		capN := burst * nanoPerMilli
		tokens := capN
		if st != nil {
			tokens = bucketTokens(st, nowUs, rate, capN)
		}
		a, b := bucketState(tokens, nowUs, rate)
		*dst = state{a: a, b: b}
		return
	}
	*dst = advanceWindow(o, st, nowUs)
}

// advanceWindow is advance for the window algorithms.
func advanceWindow(o *op, st *state, nowUs int64) state {
	switch o.algo {
	case FixedWindow:
		start := fixedStart(o, nowUs/1000)
		if st == nil || start > st.a {
			return state{a: start, capv: -1}
		}
		return state{a: st.a, b: st.b, counts: st.counts, capv: st.capv}
	case SlidingWindowCounter:
		nowMs := nowUs / 1000
		start := nowMs - nowMs%o.windowMs
		if st == nil {
			return state{a: start}
		}
		s := state{a: st.a, b: st.b, c: st.c}
		switch {
		case start <= s.a:
		case start == s.a+o.windowMs:
			s.c, s.b, s.a = s.b, 0, start
		default:
			s.c, s.b, s.a = 0, 0, start
		}
		return s
	case SlidingWindowLog:
		var s state
		if st == nil {
			return s
		}
		now := nowUs / 1000
		if n := len(st.log); n > 0 && now < st.log[n-1].ts {
			now = st.log[n-1].ts
		}
		i := 0
		for i < len(st.log) && st.log[i].ts <= now-o.windowMs {
			i++
		}
		s.log = st.log[i:]
		return s
	}
	return state{}
}

// windowNow is the time (ms) a window algorithm works at: never earlier
// than the state's own time, so a clock that steps back mints nothing.
func windowNow(o *op, s *state, nowUs int64) int64 {
	now := nowUs / 1000
	switch o.algo {
	case SlidingWindowCounter, FixedWindow:
		if s.a > now {
			return s.a
		}
	case SlidingWindowLog:
		if n := len(s.log); n > 0 && s.log[n-1].ts > now {
			return s.log[n-1].ts
		}
	}
	return now
}

// swcEstimate is the sliding window counter's weighted estimate
// p*(W-e)/W + c, in doubles, in Lua's order of operations. The explicit
// conversions forbid fused multiply-add, which would round differently.
func swcEstimate(s *state, windowMs, elapsed int64) float64 {
	prod := float64(float64(s.c) * float64(windowMs-elapsed))
	return float64(prod/float64(windowMs)) + float64(s.b)
}

// decide evaluates one policy at nowUs on the advanced state s: whether it
// admits o.cost, and its retry and delay answers.
func decide(o *op, s *state, nowUs, rate, burst int64) (bool, result) {
	var res result
	admit := decideTo(&res, o, s, nowUs, rate, burst)
	return admit, res
}

// decideTo is decide writing the answers into *res (which it zeroes
// first, allowed included) and returning whether the policy admits.
func decideTo(res *result, o *op, s *state, nowUs, rate, burst int64) (admit bool) {
	*res = result{}
	switch o.algo {
	case TokenBucket, LeakyBucket:
		rate, burst = bucketLimits(rate, burst)
		if o.cost > burst/1000 { // cost x 1000 > burst, without overflow
			res.retryMs = -1
			return false
		}
		capN := burst * nanoPerMilli
		tokens := bucketTokens(s, nowUs, rate, capN)
		costN := o.cost * nano
		admit = tokens >= costN
		switch {
		case admit && o.algo == LeakyBucket && rate > 0:
			res.delayMs = ceilDiv(ceilDiv(capN-tokens, rate), 1000)
		case !admit && rate > 0:
			res.retryMs = ceilDiv(ceilDiv(costN-tokens, rate), 1000)
		case !admit:
			res.retryMs = -1 // no refill: only a new rate can admit it
		}
		return admit
	case FixedWindow:
		now := windowNow(o, s, nowUs)
		if o.replicated() {
			admit = o.cost <= o.limit-s.total() && (s.capv < 0 || o.cost <= s.capv-s.countOf(o.region))
		} else {
			admit = o.cost <= o.limit-s.b // b + cost <= limit, without overflow
		}
		if !admit {
			if o.cost > o.limit {
				res.retryMs = -1
			} else {
				res.retryMs = fixedEnd(o, s.a) - now
			}
		}
	case SlidingWindowCounter:
		e := windowNow(o, s, nowUs) - s.a
		est := swcEstimate(s, o.windowMs, e)
		admit = est+float64(o.cost) <= float64(o.limit)
		if !admit {
			switch need := o.limit - s.b - o.cost; {
			case o.cost > o.limit:
				res.retryMs = -1
			case need >= 0:
				e2 := o.windowMs - int64(math.Floor(float64(float64(need)*float64(o.windowMs))/float64(s.c)))
				res.retryMs = max(1, e2-e)
			case s.b == 0:
				res.retryMs = o.windowMs - e
			default:
				need2 := o.limit - o.cost
				e3 := o.windowMs - int64(math.Floor(float64(float64(need2)*float64(o.windowMs))/float64(s.b)))
				res.retryMs = o.windowMs - e + max(0, e3)
			}
		}
	case SlidingWindowLog:
		now := windowNow(o, s, nowUs)
		var total int64
		for _, le := range s.log {
			total += le.cost
		}
		admit = o.cost <= o.limit-total
		if !admit {
			if o.cost > o.limit {
				res.retryMs = -1
			} else {
				need := total + o.cost - o.limit
				var freed int64
				for _, le := range s.log {
					freed += le.cost
					if freed >= need {
						res.retryMs = le.ts + o.windowMs - now
						break
					}
				}
			}
		}
	}
	return admit
}

// consume spends o.cost from the advanced state s at nowUs and returns the
// new state.
func consume(o *op, s state, nowUs, rate int64) state {
	consumeTo(o, &s, nowUs, rate)
	return s
}

// consumeTo is consume updating *s in place.
func consumeTo(o *op, s *state, nowUs, rate int64) {
	switch o.algo {
	case TokenBucket, LeakyBucket:
		rate, _ = bucketLimits(rate, 0)
		tokens := bucketTokens(s, nowUs, rate, math.MaxInt64) - o.cost*nano
		*s = state{}
		s.a, s.b = bucketState(tokens, nowUs, rate)
	case FixedWindow, SlidingWindowCounter:
		if o.replicated() {
			s.counts = withCount(s.counts, o.region, s.countOf(o.region)+o.cost)
		} else {
			s.b += o.cost
		}
	case SlidingWindowLog:
		log := make([]logEntry, len(s.log), len(s.log)+1)
		copy(log, s.log)
		s.log = append(log, logEntry{ts: windowNow(o, s, nowUs), cost: o.cost})
	}
}

// report fills the quota fields of res (remaining, reset) from the final
// state s, and returns the key's TTL in milliseconds from now.
func report(o *op, s *state, nowUs, rate, burst int64, res *result) (ttlMs int64) {
	switch o.algo {
	case TokenBucket, LeakyBucket:
		rate, burst = bucketLimits(rate, burst)
		capN := burst * nanoPerMilli
		tokens := bucketTokens(s, nowUs, rate, capN)
		res.remaining = floorDiv(tokens, nano)
		fill := rate
		if fill == 0 {
			fill = max(1, o.rate)
		}
		res.resetMs = ceilDiv(ceilDiv(capN-tokens, fill), 1000)
		return res.resetMs + 1000
	case FixedWindow:
		if o.replicated() {
			res.remaining = max(0, o.limit-s.total())
			if s.capv >= 0 {
				res.remaining = min(res.remaining, max(0, s.capv-s.countOf(o.region)))
			}
		} else {
			res.remaining = max(0, o.limit-s.b)
		}
		res.resetMs = fixedEnd(o, s.a) - windowNow(o, s, nowUs)
		return res.resetMs + 1000
	case SlidingWindowCounter:
		e := windowNow(o, s, nowUs) - s.a
		est := swcEstimate(s, o.windowMs, e)
		res.remaining = max(0, int64(math.Floor(float64(o.limit)-est)))
		switch {
		case s.b > 0:
			res.resetMs = 2*o.windowMs - e
		case s.c > 0:
			res.resetMs = o.windowMs - e
		}
		return 2*o.windowMs - e + 1000
	case SlidingWindowLog:
		var total int64
		for _, le := range s.log {
			total += le.cost
		}
		res.remaining = max(0, o.limit-total)
		if n := len(s.log); n > 0 {
			res.resetMs = s.log[n-1].ts + o.windowMs - windowNow(o, s, nowUs)
		}
		return o.windowMs + 1000
	}
	return 1000
}
