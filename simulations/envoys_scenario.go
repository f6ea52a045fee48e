package simulations

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/quotientlabs/quotient/limiter"
)

// Bounds of the RLQS tier's fields.
const (
	// MaxEnvoysPerRegion bounds envoys.<region>.
	MaxEnvoysPerRegion = 256
	// MaxEnvoyReportSec bounds envoy_report_s.
	MaxEnvoyReportSec = 60
	// MaxRLQSReplicas bounds rlqs_replicas.
	MaxRLQSReplicas = 16
)

// envoyFields parses envoys, envoy_report_s and rlqs_replicas (FORMAT.md) into sc, and
// checks what the RLQS tier can enforce: a request through an Envoy falls
// in one bucket and takes one token, so traffic that reaches a region
// with Envoys names one token_bucket policy and costs 1. It runs after
// the rest of the file is parsed (regions, policies, traffic).
func (p *parser) envoyFields(f map[string]json.RawMessage, sc *Scenario, region func(string, string) (int, bool), policies map[string]*limiter.Policy) {
	sc.EnvoyReportSec, sc.RLQSReplicas = 1, 1
	raw, ok := f["envoys"]
	if rr, has := f["rlqs_replicas"]; has {
		if !ok {
			p.add("rlqs_replicas", "set without envoys: no region has an RLQS tier")
		}
		if n, okn := p.integer("rlqs_replicas", rr, 1, MaxRLQSReplicas); okn {
			sc.RLQSReplicas = int(n)
		}
	}
	if rr, has := f["envoy_report_s"]; has {
		if !ok {
			p.add("envoy_report_s", "set without envoys: no region has Envoys to report")
		}
		v, okv := p.number("envoy_report_s", rr)
		switch {
		case okv && (v <= 0 || v > MaxEnvoyReportSec):
			p.add("envoy_report_s", "must be > 0 and at most %d s, got %v", MaxEnvoyReportSec, v)
		case okv && secNs(v) < int64(1e6):
			p.add("envoy_report_s", "must be at least 0.001 s, got %v", v)
		case okv:
			sc.EnvoyReportSec = v
		}
	}
	if !ok {
		return
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		p.add("envoys", "want a JSON object of region: number of Envoys")
		return
	}
	if len(m) == 0 {
		p.add("envoys", "empty: name at least one region, or leave envoys out (gateways)")
	}
	clean := len(p.problems) == 0 // traffic indexes are the file's
	sc.Envoys = make([]int, len(sc.Regions))
	for _, name := range sortedKeys(m) {
		path := "envoys." + name
		i, ok := region(path, name)
		if !ok {
			continue
		}
		if n, ok := p.integer(path, m[name], 1, MaxEnvoysPerRegion); ok {
			sc.Envoys[i] = int(n)
		}
	}
	for i := range sc.Traffic {
		if !clean {
			break
		}
		t := &sc.Traffic[i]
		path := fmt.Sprintf("traffic[%d]", i)
		reaches := false
		for r, n := range sc.Envoys {
			if n == 0 {
				continue
			}
			if (t.Named() && r < len(t.Rate) && len(t.Rate[r]) > 0) || (!t.Named() && r < len(t.RegionMix) && t.RegionMix[r] > 0) {
				reaches = true
			}
		}
		if !reaches {
			continue
		}
		if t.Cost != 1 {
			p.add(path+".cost", "%d: traffic through Envoys (envoys) costs 1; an Envoy's bucket counts requests", t.Cost)
		}
		if len(t.Policies) != 1 {
			p.add(path+".policies", "%d policies: traffic through Envoys (envoys) names one, since a request falls in one RLQS bucket", len(t.Policies))
			continue
		}
		if pol := policies[t.Policies[0]]; pol != nil && pol.Algorithm != limiter.TokenBucket {
			j := slices.IndexFunc(sc.Policies, func(x *limiter.Policy) bool { return x.ID == pol.ID })
			p.add(fmt.Sprintf("policies[%d].algorithm", j), "%s: policy %q reaches Envoys (envoys), which enforce token_bucket policies only", pol.Algorithm, pol.ID)
		}
	}
}
