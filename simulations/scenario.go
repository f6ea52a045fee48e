package simulations

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/quotientlabs/quotient/limiter"
)

// Scenario is one parsed and validated scenario file (see
// ../shared/scenarios/FORMAT.md, copied in the package documentation).
// Every default is filled. A Scenario is immutable once parsed and safe to
// share between goroutines.
type Scenario struct {
	// Name names the output files: [A-Za-z0-9._-], 1 to 64 characters.
	Name        string
	Description string
	// Seed seeds every random choice of a run.
	Seed int64
	// DurationSec is the simulated time in whole seconds.
	DurationSec int64
	// Regions are the region names in file order; indexes into it name
	// regions everywhere else.
	Regions []string
	// EpochSec is the rebalance interval in seconds (default 10).
	EpochSec int64
	// WindowSec is the evaluation window in seconds (default 60).
	WindowSec int64
	// WarmupSec is when the first evaluation window starts (default one
	// window).
	WarmupSec int64
	Network   Network
	// ClockSkewMs is each region's clock offset in milliseconds, by region
	// index (0 when the file gives none).
	ClockSkewMs []int64
	Faults      []Fault
	// Policies in file order, validated by limiter.ParsePolicy.
	Policies []*limiter.Policy
	Traffic  []Traffic
	Target   Target
	// Envoys is the number of Envoy proxies under each region, by index
	// (nil, or 0 for a region: its traffic goes through gateways); see
	// envoys.go.
	Envoys []int
	// EnvoyReportSec is the Envoys' reporting interval (default 1).
	EnvoyReportSec float64
	// RLQSReplicas is the number of RLQS servers under every region with
	// Envoys (default 1); see envoys.go.
	RLQSReplicas int
}

// Network is the bus model between regions' coordinators.
type Network struct {
	LatencyMs  float64 // one-way latency, milliseconds
	JitterMs   float64 // uniform jitter added to the latency, +-milliseconds
	Loss       float64 // probability that one delivery is lost, [0, 1)
	Duplicate  float64 // probability that one delivery is duplicated, [0, 1)
	Partitions []Partition
}

// Partition cuts Regions (indexes) off from every other region between
// FromSec and ToSec.
type Partition struct {
	Regions        []int
	FromSec, ToSec float64
}

// FaultKind names a fault.
type FaultKind string

// Faults the engine knows.
const (
	CoordinatorDown FaultKind = "coordinator_down"
	StoreDown       FaultKind = "store_down"
)

// Fault is one fault of one region between FromSec and ToSec.
type Fault struct {
	Kind           FaultKind
	Region         int
	FromSec, ToSec float64
}

// Arrivals names an arrival process.
type Arrivals string

// Arrival processes.
const (
	Poisson Arrivals = "poisson"
	Uniform Arrivals = "uniform"
)

// Step is one point of a rate schedule: from AtSec on, Rate requests per
// second (until the next point).
type Step struct {
	AtSec float64
	Rate  float64
}

// Traffic is one entry of the traffic list: a named key (Key set, Rate by
// region index) or a generated group (KeyPrefix set, Count keys with Zipf
// popularity, TotalRate spread over regions by RegionMix).
type Traffic struct {
	Key       string
	KeyPrefix string
	Count     int
	Policies  []string
	Arrivals  Arrivals
	// Cost is the cost units of every request (default 1).
	Cost int64
	// Rate is the schedule of each region (by index; nil: no traffic).
	Rate      [][]Step
	TotalRate []Step
	ZipfS     float64
	// RegionMix is each region's part of TotalRate, by index; sums to 1.
	RegionMix []float64
}

// Named reports whether t is a named key (not a generated group).
func (t *Traffic) Named() bool { return t.KeyPrefix == "" }

// Target is the accuracy bound, in fractions of the window allowance.
type Target struct {
	MaxOver  float64
	MaxUnder float64
}

// ErrInvalidScenario is wrapped by every validation error.
var ErrInvalidScenario = errors.New("simulations: invalid scenario")

// ScenarioError lists every problem found in a scenario file, each with the
// JSON path of the field, such as "traffic[1].rate.us-west".
type ScenarioError struct {
	Problems []Problem
}

// Problem is one problem at one field.
type Problem struct {
	Path string
	Msg  string
}

func (p Problem) String() string { return p.Path + ": " + p.Msg }

func (e *ScenarioError) Error() string {
	var b strings.Builder
	b.WriteString("simulations: invalid scenario: ")
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(p.String())
	}
	return b.String()
}

// Unwrap makes errors.Is(err, ErrInvalidScenario) hold.
func (e *ScenarioError) Unwrap() error { return ErrInvalidScenario }

// Bounds of scenario values, so a run fits in memory and time.
const (
	MaxRegions     = 16
	MaxDurationSec = 7 * 86400
	MaxGroupCount  = 1_000_000
	MaxRatePerSec  = 1e7
)

var namePattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

type parser struct {
	problems []Problem
}

func (p *parser) add(path, format string, args ...any) {
	p.problems = append(p.problems, Problem{Path: path, Msg: fmt.Sprintf(format, args...)})
}

// object decodes raw as a JSON object whose field names must be in allowed.
// It reports unknown fields and returns the known ones (nil if raw is not an
// object).
func (p *parser) object(path string, raw json.RawMessage, allowed ...string) map[string]json.RawMessage {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		p.add(path, "want a JSON object")
		return nil
	}
	for _, name := range sortedKeys(fields) {
		known := false
		for _, a := range allowed {
			if a == name {
				known = true
				break
			}
		}
		if !known {
			p.add(join(path, name), "unknown field")
			delete(fields, name)
		}
	}
	return fields
}

func join(path, name string) string {
	if name == "" {
		return path + `[""]`
	}
	if path == "" {
		return name
	}
	return path + "." + name
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// number decodes a finite JSON number. A null is refused too
// (encoding/json would leave it 0, and the file would be read as if it
// said 0).
func (p *parser) number(path string, raw json.RawMessage) (float64, bool) {
	var v float64
	if err := json.Unmarshal(raw, &v); err != nil || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		p.add(path, "want a number, got %s", short(raw))
		return 0, false
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		p.add(path, "want a finite number")
		return 0, false
	}
	return v, true
}

// integer decodes a whole JSON number in [lo, hi].
func (p *parser) integer(path string, raw json.RawMessage, lo, hi int64) (int64, bool) {
	v, ok := p.number(path, raw)
	if !ok {
		return 0, false
	}
	if v != math.Trunc(v) {
		p.add(path, "want a whole number, got %v", v)
		return 0, false
	}
	if v < float64(lo) || v > float64(hi) {
		p.add(path, "must be between %d and %d, got %v", lo, hi, v)
		return 0, false
	}
	return int64(v), true
}

// ranged decodes a number in [lo, hi] (hiOpen: [lo, hi)).
func (p *parser) ranged(path string, raw json.RawMessage, lo, hi float64, hiOpen bool) (float64, bool) {
	v, ok := p.number(path, raw)
	if !ok {
		return 0, false
	}
	if v < lo || v > hi || (hiOpen && v == hi) {
		bracket := "]"
		if hiOpen {
			bracket = ")"
		}
		p.add(path, "must be in [%v, %v%s, got %v", lo, hi, bracket, v)
		return 0, false
	}
	return v, true
}

func (p *parser) str(path string, raw json.RawMessage) (string, bool) {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		p.add(path, "want a string, got %s", short(raw))
		return "", false
	}
	return s, true
}

func (p *parser) array(path string, raw json.RawMessage) ([]json.RawMessage, bool) {
	var a []json.RawMessage
	if err := json.Unmarshal(raw, &a); err != nil || (a == nil && !bytes.Equal(bytes.TrimSpace(raw), []byte("[]"))) {
		p.add(path, "want a JSON array, got %s", short(raw))
		return nil, false
	}
	return a, true
}

// short quotes a raw JSON value for a message, cut to 40 bytes.
func short(raw json.RawMessage) string {
	s := strings.TrimSpace(string(raw))
	if len(s) > 40 {
		s = s[:37] + "..."
	}
	if s == "" {
		return "nothing"
	}
	return s
}

// ParseScenario parses and validates one scenario file. It is strict:
// unknown or repeated fields, wrong types, undeclared regions, negative
// rates, empty schedules and policies the product would reject are errors.
// The error is a *ScenarioError listing every problem found with the path
// of its field; it wraps ErrInvalidScenario.
func ParseScenario(data []byte) (*Scenario, error) {
	var p parser
	if path, err := duplicateKey(data); err != nil {
		p.add(path, "%v", err)
		return nil, &ScenarioError{Problems: p.problems}
	}
	sc := p.scenario(data)
	if len(p.problems) > 0 {
		return nil, &ScenarioError{Problems: p.problems}
	}
	return sc, nil
}

var topFields = []string{
	"name", "description", "seed", "duration_s", "regions", "epoch_s", "window_s", "warmup_s",
	"network", "clock_skew_ms", "faults", "policies", "traffic", "target",
	"envoys", "envoy_report_s", "rlqs_replicas",
}

func (p *parser) scenario(data []byte) *Scenario {
	f := p.object("", data, topFields...)
	if f == nil {
		p.problems[len(p.problems)-1].Path = "scenario"
		return nil
	}
	sc := &Scenario{EpochSec: 10, WindowSec: 60, WarmupSec: -1, Target: Target{MaxOver: 0.15, MaxUnder: 0.15}}

	if raw, ok := f["name"]; !ok {
		p.add("name", "required")
	} else if s, ok := p.str("name", raw); ok {
		if !namePattern.MatchString(s) {
			p.add("name", "%q: must be 1 to 64 characters of A-Z a-z 0-9 . _ - (it names the output files)", s)
		}
		sc.Name = s
	}
	if raw, ok := f["description"]; ok {
		sc.Description, _ = p.str("description", raw)
	}
	if raw, ok := f["seed"]; ok {
		sc.Seed, _ = p.integer("seed", raw, -(1 << 53), 1<<53)
	}
	if raw, ok := f["duration_s"]; !ok {
		p.add("duration_s", "required")
	} else {
		sc.DurationSec, _ = p.integer("duration_s", raw, 1, MaxDurationSec)
	}
	if raw, ok := f["epoch_s"]; ok {
		sc.EpochSec, _ = p.integer("epoch_s", raw, 1, 3600)
	}
	if raw, ok := f["window_s"]; ok {
		sc.WindowSec, _ = p.integer("window_s", raw, 1, MaxDurationSec)
	}
	if raw, ok := f["warmup_s"]; ok {
		sc.WarmupSec, _ = p.integer("warmup_s", raw, 0, MaxDurationSec)
	}
	if sc.WarmupSec < 0 {
		sc.WarmupSec = sc.WindowSec
	}
	if sc.DurationSec > 0 && sc.WindowSec > 0 && sc.WarmupSec+sc.WindowSec > sc.DurationSec {
		p.add("duration_s", "%d s leaves no evaluation window after warmup_s %d and window_s %d", sc.DurationSec, sc.WarmupSec, sc.WindowSec)
	}

	regionIndex := map[string]int{}
	if raw, ok := f["regions"]; !ok {
		p.add("regions", "required")
	} else if arr, ok := p.array("regions", raw); ok {
		if len(arr) < 1 || len(arr) > MaxRegions {
			p.add("regions", "want 1 to %d regions, got %d", MaxRegions, len(arr))
		}
		for i, r := range arr {
			path := fmt.Sprintf("regions[%d]", i)
			name, ok := p.str(path, r)
			if !ok {
				continue
			}
			if !namePattern.MatchString(name) {
				p.add(path, "%q: must be 1 to 64 characters of A-Z a-z 0-9 . _ -", name)
				continue
			}
			if j, dup := regionIndex[name]; dup {
				p.add(path, "%q repeats regions[%d]", name, j)
				continue
			}
			regionIndex[name] = len(sc.Regions)
			sc.Regions = append(sc.Regions, name)
		}
	}
	region := func(path, name string) (int, bool) {
		i, ok := regionIndex[name]
		if !ok {
			p.add(path, "region not declared")
		}
		return i, ok
	}
	regionByRaw := func(path string, raw json.RawMessage) (int, bool) {
		name, ok := p.str(path, raw)
		if !ok {
			return 0, false
		}
		i, ok := regionIndex[name]
		if !ok {
			p.add(path, "region %q not declared", name)
		}
		return i, ok
	}

	if raw, ok := f["network"]; ok {
		p.network(raw, sc, regionByRaw)
	}
	sc.ClockSkewMs = make([]int64, len(sc.Regions))
	if raw, ok := f["clock_skew_ms"]; ok {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil || m == nil {
			p.add("clock_skew_ms", "want a JSON object of region: milliseconds")
		}
		for _, name := range sortedKeys(m) {
			path := "clock_skew_ms." + name
			if i, ok := region(path, name); ok {
				sc.ClockSkewMs[i], _ = p.integer(path, m[name], -3_600_000, 3_600_000)
			}
		}
	}
	if raw, ok := f["faults"]; ok {
		if arr, ok := p.array("faults", raw); ok {
			for i, fr := range arr {
				p.fault(fmt.Sprintf("faults[%d]", i), fr, sc, regionByRaw)
			}
		}
	}

	policyIndex := map[string]*limiter.Policy{}
	if raw, ok := f["policies"]; !ok {
		p.add("policies", "required")
	} else if arr, ok := p.array("policies", raw); ok {
		if len(arr) == 0 {
			p.add("policies", "empty: want at least one policy")
		}
		for i, pr := range arr {
			path := fmt.Sprintf("policies[%d]", i)
			pol := p.policy(path, pr)
			if pol == nil {
				continue
			}
			if _, dup := policyIndex[pol.ID]; dup {
				p.add(path+".id", "duplicate id %q", pol.ID)
				continue
			}
			policyIndex[pol.ID] = pol
			sc.Policies = append(sc.Policies, pol)
		}
	}

	if raw, ok := f["traffic"]; !ok {
		p.add("traffic", "required")
	} else if arr, ok := p.array("traffic", raw); ok {
		if len(arr) == 0 {
			p.add("traffic", "empty: want at least one entry")
		}
		for i, tr := range arr {
			if t := p.traffic(fmt.Sprintf("traffic[%d]", i), tr, sc, region, policyIndex); t != nil {
				sc.Traffic = append(sc.Traffic, *t)
			}
		}
	}

	if raw, ok := f["target"]; ok {
		if t := p.object("target", raw, "max_over", "max_under"); t != nil {
			if r, ok := t["max_over"]; ok {
				sc.Target.MaxOver, _ = p.ranged("target.max_over", r, 0, 10, false)
			}
			if r, ok := t["max_under"]; ok {
				sc.Target.MaxUnder, _ = p.ranged("target.max_under", r, 0, 10, false)
			}
		}
	}
	p.envoyFields(f, sc, region, policyIndex)
	return sc
}

func (p *parser) network(raw json.RawMessage, sc *Scenario, regionByRaw func(string, json.RawMessage) (int, bool)) {
	f := p.object("network", raw, "latency_ms", "jitter_ms", "loss", "duplicate", "partitions")
	if f == nil {
		return
	}
	n := &sc.Network
	if r, ok := f["latency_ms"]; ok {
		n.LatencyMs, _ = p.ranged("network.latency_ms", r, 0, 3_600_000, false)
	}
	if r, ok := f["jitter_ms"]; ok {
		n.JitterMs, _ = p.ranged("network.jitter_ms", r, 0, 3_600_000, false)
	}
	if r, ok := f["loss"]; ok {
		n.Loss, _ = p.ranged("network.loss", r, 0, 1, true)
	}
	if r, ok := f["duplicate"]; ok {
		n.Duplicate, _ = p.ranged("network.duplicate", r, 0, 1, true)
	}
	if r, ok := f["partitions"]; ok {
		arr, ok := p.array("network.partitions", r)
		if !ok {
			return
		}
		for i, pr := range arr {
			path := fmt.Sprintf("network.partitions[%d]", i)
			pf := p.object(path, pr, "regions", "from_s", "to_s")
			if pf == nil {
				continue
			}
			var part Partition
			ok := true
			if rr, has := pf["regions"]; !has {
				p.add(path+".regions", "required")
				ok = false
			} else if ra, isArr := p.array(path+".regions", rr); isArr {
				if len(ra) == 0 {
					p.add(path+".regions", "empty: want at least one region")
					ok = false
				}
				seen := map[int]bool{}
				for j, x := range ra {
					idx, good := regionByRaw(fmt.Sprintf("%s.regions[%d]", path, j), x)
					if good && !seen[idx] {
						seen[idx] = true
						part.Regions = append(part.Regions, idx)
					}
					ok = ok && good
				}
			} else {
				ok = false
			}
			from, to, good := p.interval(path, pf)
			part.FromSec, part.ToSec = from, to
			if ok && good {
				sort.Ints(part.Regions)
				n.Partitions = append(n.Partitions, part)
			}
		}
	}
}

// interval reads from_s and to_s (both required, from < to).
func (p *parser) interval(path string, f map[string]json.RawMessage) (float64, float64, bool) {
	var from, to float64
	ok := true
	for _, name := range []string{"from_s", "to_s"} {
		r, has := f[name]
		if !has {
			p.add(path+"."+name, "required")
			ok = false
			continue
		}
		v, good := p.ranged(path+"."+name, r, 0, MaxDurationSec, false)
		ok = ok && good
		if name == "from_s" {
			from = v
		} else {
			to = v
		}
	}
	if ok && to <= from {
		p.add(path+".to_s", "must be after from_s (%v), got %v", from, to)
		ok = false
	}
	return from, to, ok
}

func (p *parser) fault(path string, raw json.RawMessage, sc *Scenario, regionByRaw func(string, json.RawMessage) (int, bool)) {
	f := p.object(path, raw, "kind", "region", "from_s", "to_s")
	if f == nil {
		return
	}
	var ft Fault
	ok := true
	if r, has := f["kind"]; !has {
		p.add(path+".kind", "required (coordinator_down or store_down)")
		ok = false
	} else if s, good := p.str(path+".kind", r); good {
		ft.Kind = FaultKind(s)
		if ft.Kind != CoordinatorDown && ft.Kind != StoreDown {
			p.add(path+".kind", "unknown fault %q (want coordinator_down or store_down)", s)
			ok = false
		}
	} else {
		ok = false
	}
	if r, has := f["region"]; !has {
		p.add(path+".region", "required")
		ok = false
	} else {
		var good bool
		ft.Region, good = regionByRaw(path+".region", r)
		ok = ok && good
	}
	from, to, good := p.interval(path, f)
	ft.FromSec, ft.ToSec = from, to
	if ok && good {
		sc.Faults = append(sc.Faults, ft)
	}
}

// policy parses one policy document with the product's parser, rewriting
// its paths ("policy.burst") to the scenario's ("policies[0].burst").
func (p *parser) policy(path string, raw json.RawMessage) *limiter.Policy {
	pol, err := limiter.ParsePolicy(raw)
	var perr *limiter.PolicyError
	switch {
	case errors.As(err, &perr):
		for _, fe := range perr.Fields {
			p.add(path+strings.TrimPrefix(fe.Path, "policy"), "%s", fe.Msg)
		}
		return nil
	case err != nil:
		p.add(path, "%v", err)
		return nil
	}
	if pol.Scope != limiter.ScopeGlobal {
		p.add(path+".scope", "the simulator measures global limits: want \"global\", got %q", pol.Scope)
		return nil
	}
	if pol.Monthly() {
		p.add(path+".window", "calendar months are not simulated (the ideal and the evaluation windows have fixed lengths): use window_s")
		return nil
	}
	return pol
}

var namedFields = []string{"key", "policies", "arrivals", "cost", "rate"}
var groupFields = []string{"key_prefix", "count", "policies", "arrivals", "cost", "total_rate", "zipf_s", "region_mix"}

func (p *parser) traffic(path string, raw json.RawMessage, sc *Scenario, region func(string, string) (int, bool), policies map[string]*limiter.Policy) *Traffic {
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(raw, &probe); err != nil || probe == nil {
		p.add(path, "want a JSON object")
		return nil
	}
	_, hasKey := probe["key"]
	_, hasPrefix := probe["key_prefix"]
	before := len(p.problems)
	var f map[string]json.RawMessage
	switch {
	case hasKey && hasPrefix:
		p.add(path, "has both key and key_prefix: a named key or a generated group, not both")
		return nil
	case hasKey:
		f = p.object(path, raw, namedFields...)
	case hasPrefix:
		f = p.object(path, raw, groupFields...)
	default:
		p.add(path, "want key (a named key) or key_prefix (a generated group)")
		return nil
	}
	t := &Traffic{Arrivals: Poisson, Cost: 1}
	if hasKey {
		if s, ok := p.str(path+".key", f["key"]); ok {
			if s == "" || len(s) > 256 {
				p.add(path+".key", "must be 1 to 256 bytes")
			}
			t.Key = s
		}
	} else {
		if s, ok := p.str(path+".key_prefix", f["key_prefix"]); ok {
			if s == "" || len(s) > 200 {
				p.add(path+".key_prefix", "must be 1 to 200 bytes")
			}
			t.KeyPrefix = s
		}
	}
	if r, ok := f["policies"]; !ok {
		p.add(path+".policies", "required")
	} else if arr, ok := p.array(path+".policies", r); ok {
		if len(arr) == 0 {
			p.add(path+".policies", "empty: want at least one policy id")
		}
		seen := map[string]bool{}
		for i, x := range arr {
			pp := fmt.Sprintf("%s.policies[%d]", path, i)
			id, ok := p.str(pp, x)
			if !ok {
				continue
			}
			switch {
			case policies[id] == nil:
				p.add(pp, "policy %q not declared in policies", id)
			case seen[id]:
				p.add(pp, "policy %q listed twice", id)
			default:
				seen[id] = true
				t.Policies = append(t.Policies, id)
			}
		}
	}
	if r, ok := f["arrivals"]; ok {
		if s, ok := p.str(path+".arrivals", r); ok {
			t.Arrivals = Arrivals(s)
			if t.Arrivals != Poisson && t.Arrivals != Uniform {
				p.add(path+".arrivals", "unknown arrivals %q (want poisson or uniform)", s)
			}
		}
	}
	if r, ok := f["cost"]; ok {
		t.Cost, _ = p.integer(path+".cost", r, 1, limiter.MaxCost)
	}
	if hasKey {
		if r, ok := f["rate"]; !ok {
			p.add(path+".rate", "required: a schedule per region")
		} else {
			var m map[string]json.RawMessage
			if err := json.Unmarshal(r, &m); err != nil || m == nil {
				p.add(path+".rate", "want a JSON object of region: schedule")
			} else {
				if len(m) == 0 {
					p.add(path+".rate", "empty: want a schedule for at least one region")
				}
				t.Rate = make([][]Step, len(sc.Regions))
				for _, name := range sortedKeys(m) {
					rp := path + ".rate." + name
					if i, ok := region(rp, name); ok {
						t.Rate[i] = p.schedule(rp, m[name])
					}
				}
			}
		}
	} else {
		if r, ok := f["count"]; !ok {
			p.add(path+".count", "required")
		} else {
			c, _ := p.integer(path+".count", r, 1, MaxGroupCount)
			t.Count = int(c)
		}
		if r, ok := f["total_rate"]; !ok {
			p.add(path+".total_rate", "required")
		} else {
			t.TotalRate = p.schedule(path+".total_rate", r)
		}
		if r, ok := f["zipf_s"]; ok {
			t.ZipfS, _ = p.ranged(path+".zipf_s", r, 0, 10, false)
		}
		if r, ok := f["region_mix"]; !ok {
			p.add(path+".region_mix", "required: each region's part of total_rate")
		} else {
			var m map[string]json.RawMessage
			if err := json.Unmarshal(r, &m); err != nil || m == nil {
				p.add(path+".region_mix", "want a JSON object of region: fraction")
			} else {
				t.RegionMix = make([]float64, len(sc.Regions))
				sum := 0.0
				for _, name := range sortedKeys(m) {
					rp := path + ".region_mix." + name
					v, ok := p.ranged(rp, m[name], 0, 1, false)
					if i, known := region(rp, name); known && ok {
						t.RegionMix[i] = v
						sum += v
					}
				}
				if math.Abs(sum-1) > 1e-6 && len(p.problems) == before {
					p.add(path+".region_mix", "fractions must sum to 1, got %v", sum)
				}
			}
		}
	}
	if len(p.problems) > before {
		return nil
	}
	return t
}

// schedule parses [[t_s, rate], ...]: at least one point, times >= 0 and
// strictly increasing, rates >= 0.
func (p *parser) schedule(path string, raw json.RawMessage) []Step {
	arr, ok := p.array(path, raw)
	if !ok {
		return nil
	}
	if len(arr) == 0 {
		p.add(path, "empty schedule: want at least one [t_s, requests_per_s] point")
		return nil
	}
	steps := make([]Step, 0, len(arr))
	for i, x := range arr {
		pp := fmt.Sprintf("%s[%d]", path, i)
		pair, ok := p.array(pp, x)
		if !ok {
			continue
		}
		if len(pair) != 2 {
			p.add(pp, "want [t_s, requests_per_s], got %d values", len(pair))
			continue
		}
		at, ok1 := p.ranged(pp+"[0]", pair[0], 0, MaxDurationSec, false)
		rate, ok2 := p.number(pp+"[1]", pair[1])
		if ok2 && (rate < 0 || rate > MaxRatePerSec) {
			p.add(pp+"[1]", "rate must be between 0 and %g requests per second, got %v", MaxRatePerSec, rate)
			ok2 = false
		}
		if !ok1 || !ok2 {
			continue
		}
		if len(steps) > 0 && at <= steps[len(steps)-1].AtSec {
			p.add(pp+"[0]", "times must increase: %v after %v", at, steps[len(steps)-1].AtSec)
			continue
		}
		steps = append(steps, Step{AtSec: at, Rate: rate})
	}
	return steps
}

// duplicateKey walks data and reports the path of the first object key that
// appears twice in one object (encoding/json would silently keep the last).
// Malformed JSON is reported at path "scenario".
func duplicateKey(data []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	type frame struct {
		path   string
		object bool
		keys   map[string]bool
		key    string // current key (objects) or index (arrays)
		index  int
		expect bool // objects: the next string is a key
	}
	var stack []*frame
	child := func() string {
		if len(stack) == 0 {
			return ""
		}
		top := stack[len(stack)-1]
		if top.object {
			return join(top.path, top.key)
		}
		return top.path + "[" + strconv.Itoa(top.index) + "]"
	}
	done := func() { // a value finished inside the top frame
		if len(stack) == 0 {
			return
		}
		top := stack[len(stack)-1]
		if top.object {
			top.expect = true
		} else {
			top.index++
		}
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			if len(stack) > 0 {
				return "scenario", errors.New("malformed JSON: unexpected end")
			}
			return "", nil
		}
		if err != nil {
			return "scenario", fmt.Errorf("malformed JSON: %v", err)
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{', '[':
				stack = append(stack, &frame{path: child(), object: d == '{', keys: map[string]bool{}, expect: true})
			default:
				stack = stack[:len(stack)-1]
				done()
			}
			continue
		}
		if top != nil && top.object && top.expect {
			k, _ := tok.(string)
			if top.keys[k] {
				return join(top.path, k), fmt.Errorf("field %q appears twice in one object", k)
			}
			top.keys[k] = true
			top.key = k
			top.expect = false
			continue
		}
		done()
		if dec.More() || len(stack) > 0 {
			continue
		}
	}
}
