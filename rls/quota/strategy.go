package quota

import (
	"math"
	"math/bits"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Strategy encodes an assignment as Envoy's RateLimitStrategy:
// ALLOW_ALL when unlimited, DENY_ALL for a zero amount, else a
// TokenBucket of max_tokens = the burst in whole requests, and
// tokens_per_fill per fill_interval = the rate, rounded down. Envoy adds
// tokens_per_fill once per fill_interval, so the encoding keeps the
// interval near 100 ms (tokens_per_fill = rate / 10, at least 1) rather
// than one large fill per second. The same amount always encodes to the
// same message, which is what lets Envoy extend an unchanged assignment
// instead of restarting its bucket.
func Strategy(unlimited bool, a Amount) *typev3.RateLimitStrategy {
	if unlimited {
		return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}}
	}
	a = wire(a)
	if a == (Amount{}) {
		return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
	}
	tpf := max(1, min(a.RateMilli/10_000, math.MaxUint32))
	// fill_interval = tpf / rate, rounded up to the nanosecond so that the
	// encoded rate never exceeds the assigned one.
	ns := mulDivUp(tpf, 1_000_000_000_000, a.RateMilli)
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     uint32(min(a.BurstMilli/1000, math.MaxUint32)),
		TokensPerFill: wrapperspb.UInt32(uint32(tpf)),
		FillInterval:  durationpb.New(time.Duration(ns)),
	}}}
}

// mulDivUp is ceil(a*b/c) for a, b >= 0 and c > 0, capped at MaxInt64.
func mulDivUp(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, rem := bits.Div64(hi, lo, uint64(c))
	if rem > 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// AmountOf decodes what a strategy lets an Envoy admit: the token
// bucket's rate (rounded down) and burst in milli units; DENY_ALL and a
// missing strategy's ALLOW_ALL are reported as unlimited (allow) or zero.
// It is the inverse of Strategy up to rounding, for tests and tools.
func AmountOf(s *typev3.RateLimitStrategy) (a Amount, unlimited bool) {
	switch {
	case s == nil:
		return Amount{}, true
	case s.GetTokenBucket() != nil:
		tb := s.GetTokenBucket()
		tpf := int64(1)
		if tb.GetTokensPerFill() != nil {
			tpf = int64(tb.GetTokensPerFill().GetValue())
		}
		ns := tb.GetFillInterval().AsDuration().Nanoseconds()
		if ns <= 0 {
			return Amount{}, false
		}
		return Amount{RateMilli: mulDiv(tpf, 1_000_000_000_000, ns), BurstMilli: int64(tb.GetMaxTokens()) * 1000}, false
	case s.GetRequestsPerTimeUnit() != nil:
		return Amount{}, false
	}
	return Amount{}, s.GetBlanketRule() == typev3.RateLimitStrategy_ALLOW_ALL
}
