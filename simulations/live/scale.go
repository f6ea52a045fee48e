package live

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/simulations"
)

// Check reports the fields of sc that live mode cannot run, as a
// *simulations.ScenarioError naming each field (nil when it can run sc).
// Live mode v1 runs the regions, epoch, windows, duration, token_bucket
// and leaky_bucket policies on api_key, account or user subjects, and every
// traffic entry. It rejects network loss, duplication and partitions,
// clock skew, faults, fixed-window policies, ip subjects and envoys (the
// RLQS tier runs in virtual time only). Network
// latency and jitter are accepted but not injected: reports travel over
// the real broker on loopback, with its own latency.
func Check(sc *simulations.Scenario) error {
	var probs []simulations.Problem
	add := func(path, format string, args ...any) {
		probs = append(probs, simulations.Problem{Path: path, Msg: fmt.Sprintf(format, args...)})
	}
	n := sc.Network
	if n.Loss != 0 {
		add("network.loss", "not supported in live mode (messages go over a real broker); want 0")
	}
	if n.Duplicate != 0 {
		add("network.duplicate", "not supported in live mode (messages go over a real broker); want 0")
	}
	if len(n.Partitions) > 0 {
		add("network.partitions", "not supported in live mode v1; run it in virtual time")
	}
	for r, skew := range sc.ClockSkewMs {
		if skew != 0 {
			add("clock_skew_ms."+sc.Regions[r], "not supported in live mode (every region uses this machine's clock); want 0")
		}
	}
	for i, f := range sc.Faults {
		add(fmt.Sprintf("faults[%d].kind", i), "%s is not supported in live mode v1; run it in virtual time", f.Kind)
	}
	for i, p := range sc.Policies {
		switch p.Algorithm {
		case limiter.TokenBucket, limiter.LeakyBucket:
		default:
			add(fmt.Sprintf("policies[%d].algorithm", i), "%s is not supported in live mode v1 (token_bucket and leaky_bucket are)", p.Algorithm)
		}
		if p.Subject == limiter.SubjectIP {
			add(fmt.Sprintf("policies[%d].subject", i), "ip is not supported in live mode (scenario keys are not addresses)")
		}
	}
	if sc.Envoys != nil {
		add("envoys", "the RLQS tier (Envoys) is simulated in virtual time only; run the scenario without --live")
	}
	if len(probs) > 0 {
		return &simulations.ScenarioError{Problems: probs}
	}
	return nil
}

// ScaleRates returns a copy of sc with every rate divided by factor: the
// traffic's request rates, and each bucket policy's rate_per_sec and
// burst. Durations, epochs, windows and costs are unchanged, so the copy
// is the same scenario with 1/factor of the requests; both modes can run
// it (the live mode to keep the request rate within what the machine can
// serve, the virtual one to compare). The seed is kept, so the copy draws
// its own arrivals. factor 1 returns sc itself. A scaled policy that no
// longer validates (a rate below 0.001 or with more than three decimals)
// is an error naming the field.
func ScaleRates(sc *simulations.Scenario, factor float64) (*simulations.Scenario, error) {
	if factor == 1 {
		return sc, nil
	}
	if !(factor > 0) || math.IsInf(factor, 0) {
		return nil, fmt.Errorf("%w: rate scale %v: want a number > 0", ErrConfig, factor)
	}
	out := *sc
	out.Policies = make([]*limiter.Policy, len(sc.Policies))
	var probs []simulations.Problem
	for i, p := range sc.Policies {
		q, err := derive(p, func(q *limiter.Policy) {
			if q.Algorithm == limiter.TokenBucket || q.Algorithm == limiter.LeakyBucket {
				q.RatePerSec = round3(p.RatePerSec / factor)
				q.Burst = round3(p.Burst / factor)
			}
		})
		if err != nil {
			probs = append(probs, simulations.Problem{Path: fmt.Sprintf("policies[%d]", i),
				Msg: fmt.Sprintf("divided by rate scale %v: %v", factor, err)})
		}
		out.Policies[i] = q
	}
	if len(probs) > 0 {
		return nil, &simulations.ScenarioError{Problems: probs}
	}
	out.Traffic = make([]simulations.Traffic, len(sc.Traffic))
	for i, tr := range sc.Traffic {
		t := tr
		t.Rate = make([][]simulations.Step, len(tr.Rate))
		for r, steps := range tr.Rate {
			t.Rate[r] = scaleSteps(steps, factor)
		}
		t.TotalRate = scaleSteps(tr.TotalRate, factor)
		out.Traffic[i] = t
	}
	out.Description = sc.Description + " (rates / " + strconv.FormatFloat(factor, 'g', -1, 64) + ")"
	return &out, nil
}

func scaleSteps(steps []simulations.Step, factor float64) []simulations.Step {
	if steps == nil {
		return nil
	}
	out := make([]simulations.Step, len(steps))
	for i, s := range steps {
		out[i] = simulations.Step{AtSec: s.AtSec, Rate: s.Rate / factor}
	}
	return out
}

// derive returns a validated copy of p changed by edit. The copy goes
// through JSON so that it shares nothing with p (a validated Policy is
// immutable and may be in use elsewhere).
func derive(p *limiter.Policy, edit func(*limiter.Policy)) (*limiter.Policy, error) {
	data, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	var q limiter.Policy
	if err := json.Unmarshal(data, &q); err != nil {
		return nil, err
	}
	edit(&q)
	if err := q.Validate(); err != nil {
		return nil, err
	}
	return &q, nil
}

// round3 rounds to three decimals, what policies accept.
func round3(v float64) float64 { return math.Round(v*1000) / 1000 }
