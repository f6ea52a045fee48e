package deployed

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/quotientlabs/quotient/internal/netlab"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/simulations"
)

var (
	// ErrUnavailable is wrapped when the machine lacks what a deployed run
	// needs (root, ip, nft, redis-server, the binaries); the message names
	// what is missing.
	ErrUnavailable = errors.New("deployed: unavailable")
	// ErrConfig is wrapped by errors of a bad Config.
	ErrConfig = errors.New("deployed: bad configuration")
	// ErrRun is wrapped when a run fails: a process that does not start or
	// exits, a cancelled context.
	ErrRun = errors.New("deployed: run failed")
)

// Config configures a deployed run. Start from DefaultConfig and set
// Quotient and Devkafka (or leave them empty to find them).
type Config struct {
	// TimeScale is how many scenario seconds pass in one real second (see
	// the package doc); epoch_s x 1000 / TimeScale must be whole
	// milliseconds. Default 5.
	TimeScale int
	// Quotient is the path of the quotient binary. Default: this
	// executable when its name is quotient, else "quotient" on the PATH.
	Quotient string
	// Devkafka is the path of the devkafka binary. Default: devkafka next
	// to Quotient, else on the PATH.
	Devkafka string
	// Dir receives the processes' logs and the policy and key files.
	// Default: a new temporary folder, removed after a run that succeeded.
	Dir string
	// StoreDeadline is the gateways' --timeout (the deadline of every Redis
	// call). Default 5 ms, production's.
	StoreDeadline time.Duration
	// Workers is the number of concurrent clients per region. Default 32.
	Workers int
	// HeadStartEpochs is how many epochs the coordinators run before t=0
	// at least. Default simulations.HeadStartEpochs, as in virtual time.
	HeadStartEpochs int
	// Logf, when set, receives progress lines (hosts up, faults applied).
	Logf func(format string, args ...any)
	// Progress, when set, is called after every scenario second with the
	// seconds done and the total, from the sampling goroutine.
	Progress func(done, total int64)
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{TimeScale: 5, StoreDeadline: 5 * time.Millisecond, Workers: 32, HeadStartEpochs: simulations.HeadStartEpochs}
}

// Stats describes how faithfully a run kept to its schedule and what it
// did not apply.
type Stats struct {
	// TimeScale is the scale the run used.
	TimeScale int
	// Start is the real time of the scenario's t=0.
	Start time.Time
	// Requests is the number of requests answered 200 or 429.
	Requests int64
	// Errors counts requests that got neither (transport errors or another
	// status); they are not recorded. LastError is the last of them.
	Errors    int64
	LastError string
	// MaxLateness is the longest a request waited, real time, between its
	// scheduled arrival and being sent.
	MaxLateness time.Duration
	// Late counts requests sent more than one scenario second late.
	Late int64
	// Fallback is the gateways' quotient_limiter_fallback_decisions_total
	// at the end, summed over regions (decisions that did not consult the
	// store; -1 when unreadable).
	Fallback int64
	// Applied lists how the run applied scenario fields that need saying
	// (clock_skew_ms: each skewed region's --clock-offset).
	Applied []string
	// NotApplied lists scenario fields, or parts of them, the run accepted
	// but could not apply on the real path (the skewed regions'
	// redis-server keeps the machine's clock).
	NotApplied []string
	// Warnings lists what makes the run, and virtual time on the same file,
	// leave the protocol's assumptions (clocks further apart than an epoch
	// minus the collection and publication allowance).
	Warnings []string
	// Dir is where the logs are (kept when the run failed).
	Dir string
}

// Faithful reports whether the run kept its schedule: no request more than
// one scenario second late and no errors beyond one in a thousand.
func (s Stats) Faithful() (bool, string) {
	if s.Late > 0 {
		return false, fmt.Sprintf("%d requests more than one scenario second late (worst %v real)", s.Late, s.MaxLateness.Round(time.Millisecond))
	}
	if s.Errors > s.Requests/1000 {
		return false, fmt.Sprintf("%d requests without an answer (last: %s)", s.Errors, s.LastError)
	}
	return true, ""
}

// Check reports what deployed mode cannot run in sc, as a
// *simulations.ScenarioError naming each field: fixed-window policies
// (UTC-aligned windows of the real clock; a scaled window would not start
// with the run), loss and duplication that add up to more than 1 (the
// broker draws one per report, see the package doc), subjects other than
// api_key and account, and envoys (the RLQS tier runs in virtual time
// only).
func Check(sc *simulations.Scenario) error {
	var probs []simulations.Problem
	add := func(path, format string, args ...any) {
		probs = append(probs, simulations.Problem{Path: path, Msg: fmt.Sprintf(format, args...)})
	}
	for i, p := range sc.Policies {
		switch {
		case p.Algorithm != limiter.TokenBucket && p.Algorithm != limiter.LeakyBucket:
			add(fmt.Sprintf("policies[%d].algorithm", i), "%s: deployed mode runs token and leaky buckets only (fixed windows are aligned to the real UTC clock, so a scaled window would not start with the run)", p.Algorithm)
		case p.Subject != limiter.SubjectAPIKey && p.Subject != limiter.SubjectAccount:
			add(fmt.Sprintf("policies[%d].subject", i), "%s: deployed mode identifies callers by API key (subjects api_key and account)", p.Subject)
		}
	}
	if sc.Network.Loss+sc.Network.Duplicate > 1 {
		add("network", "loss %v + duplicate %v: more than 1 (the broker draws one of them per report)", sc.Network.Loss, sc.Network.Duplicate)
	}
	if sc.Envoys != nil {
		add("envoys", "the RLQS tier (Envoys) is simulated in virtual time only; run the scenario without --deployed")
	}
	if len(probs) > 0 {
		return &simulations.ScenarioError{Problems: probs}
	}
	return nil
}

// timing is the scaled clockwork of one run (real durations).
type timing struct {
	scale            int64
	epoch, second    time.Duration
	maxWait, collect time.Duration
	flush            time.Duration
}

func (c *Config) validate(sc *simulations.Scenario) (timing, error) {
	d := DefaultConfig()
	if c.TimeScale == 0 {
		c.TimeScale = d.TimeScale
	}
	if c.StoreDeadline == 0 {
		c.StoreDeadline = d.StoreDeadline
	}
	if c.Workers == 0 {
		c.Workers = d.Workers
	}
	if c.HeadStartEpochs == 0 {
		c.HeadStartEpochs = d.HeadStartEpochs
	}
	var t timing
	switch {
	case c.TimeScale < 1:
		return t, fmt.Errorf("%w: TimeScale %d: want at least 1", ErrConfig, c.TimeScale)
	case c.StoreDeadline < 0:
		return t, fmt.Errorf("%w: StoreDeadline %v is negative", ErrConfig, c.StoreDeadline)
	case c.Workers < 1:
		return t, fmt.Errorf("%w: Workers %d: want at least 1", ErrConfig, c.Workers)
	case c.HeadStartEpochs < 0:
		return t, fmt.Errorf("%w: HeadStartEpochs %d is negative", ErrConfig, c.HeadStartEpochs)
	}
	t.scale = int64(c.TimeScale)
	epoch := time.Duration(sc.EpochSec) * time.Second
	if int64(epoch)%(t.scale*int64(time.Millisecond)) != 0 {
		return t, fmt.Errorf("%w: TimeScale %d: epoch_s %d / %d is not a whole number of milliseconds", ErrConfig, c.TimeScale, sc.EpochSec, c.TimeScale)
	}
	maxWait := min(2*time.Second, epoch/2) // the coordinator's default
	collect := min(time.Second, maxWait/2) // rebalancer.DefaultCollectDelay
	div := func(v time.Duration) time.Duration { return v / time.Duration(t.scale) }
	t.epoch, t.second = div(epoch), div(time.Second)
	t.maxWait, t.collect, t.flush = div(maxWait), div(collect), div(time.Second)
	return t, nil
}

// findBinaries fills Quotient and Devkafka; errors wrap ErrUnavailable.
func (c *Config) findBinaries() error {
	if c.Quotient == "" {
		if exe, err := os.Executable(); err == nil && filepath.Base(exe) == "quotient" {
			c.Quotient = exe
		} else if p, err := exec.LookPath("quotient"); err == nil {
			c.Quotient = p
		} else {
			return fmt.Errorf("%w: no quotient binary: this executable is not named quotient and none is on the PATH (quotient simulate --bin; make simulate-deployed builds it)", ErrUnavailable)
		}
	}
	if c.Devkafka == "" {
		next := filepath.Join(filepath.Dir(c.Quotient), "devkafka")
		if _, err := os.Stat(next); err == nil {
			c.Devkafka = next
		} else if p, err := exec.LookPath("devkafka"); err == nil {
			c.Devkafka = p
		} else {
			return fmt.Errorf("%w: no devkafka binary next to %s or on the PATH (go build -o %s ./cmd/devkafka; make simulate-deployed builds it)", ErrUnavailable, c.Quotient, next)
		}
	}
	for _, p := range []string{c.Quotient, c.Devkafka} {
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return fmt.Errorf("%w: %s is not an executable file", ErrUnavailable, p)
		}
	}
	return nil
}

// Available reports nil when this machine can run deployed mode with cfg's
// binaries, or an error wrapping ErrUnavailable naming what is missing
// (root, ip, nft, redis-server, the quotient or devkafka binary).
func Available(cfg Config) error {
	if err := netlab.Available(); err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		return fmt.Errorf("%w: needs redis-server on the PATH (Debian: redis-server)", ErrUnavailable)
	}
	return cfg.findBinaries()
}

// policyDocs returns the gateways' and coordinators' policy file: every
// policy of sc with its rate multiplied by scale and matching exactly the
// routes of the traffic entries that name it ("/t<i>/x" for entry i), with
// the entry's cost on that route.
func policyDocs(sc *simulations.Scenario, scale int64) ([]byte, error) {
	var docs []map[string]any
	for i, p := range sc.Policies {
		data, err := json.Marshal(p)
		if err != nil {
			return nil, err
		}
		var doc map[string]any
		if err := json.Unmarshal(data, &doc); err != nil {
			return nil, err
		}
		var routes []string
		cost := map[string]int64{}
		for e, tr := range sc.Traffic {
			for _, id := range tr.Policies {
				if id == p.ID {
					routes = append(routes, route(e))
					if tr.Cost != 1 {
						cost["GET "+route(e)] = tr.Cost
					}
				}
			}
		}
		if len(routes) == 0 {
			routes = []string{"/unused/" + p.ID}
		}
		doc["match"] = map[string]any{"routes": routes}
		delete(doc, "cost")
		if len(cost) > 0 {
			doc["cost"] = cost
		}
		doc["mode"] = "enforce"
		rate := p.RatePerSec * float64(scale)
		if math.Round(rate*1000) != rate*1000 {
			return nil, fmt.Errorf("%w: policies[%d]: rate_per_sec %v x %d has more than three decimals", ErrConfig, i, p.RatePerSec, scale)
		}
		doc["rate_per_sec"] = rate
		doc["burst"] = p.Burst
		docs = append(docs, doc)
	}
	out, err := json.MarshalIndent(docs, "", "  ")
	if err != nil {
		return nil, err
	}
	if _, err := limiter.ParsePolicies(out); err != nil {
		return nil, fmt.Errorf("%w: the scaled policies do not validate: %v", ErrConfig, err)
	}
	return out, nil
}

// route is the request path of traffic entry e.
func route(e int) string { return fmt.Sprintf("/t%d/x", e) }

// keyDoc returns the gateways' --keys file: every key of sc, its own
// account.
func keyDoc(sc *simulations.Scenario) ([]byte, error) {
	keys := map[string]map[string]string{}
	for i := range sc.Traffic {
		for _, k := range sc.Traffic[i].KeyNames() {
			keys[k] = map[string]string{"tier": "sim", "account": k}
		}
	}
	return json.Marshal(keys)
}

// join is strings.Join for flags.
func join(s []string) string { return strings.Join(s, ",") }

// clockOffset is region r's clock_skew_ms as its processes' --clock-offset
// (real time): the skew divided by the time scale, like every other
// duration of the scenario, so that skew / epoch, which is what the
// protocol sees, is the scenario's own and virtual time on the same file
// models the same clocks.
func clockOffset(sc *simulations.Scenario, r int, scale int64) time.Duration {
	return time.Duration(sc.ClockSkewMs[r]) * time.Millisecond / time.Duration(scale)
}

// skewNotes describes how a run at timing t applies sc's clock skew: one
// Applied line per skewed region, the NotApplied part (redis-server's
// clock) and, when the clocks are further apart than the protocol
// assumes, a warning (see the rebalancer package doc: regions' clocks
// differ by less than one epoch minus the time to collect and publish;
// the allowance taken here is the collect delay plus the max wait, both
// scaled, so a scenario that breaks it breaks it in virtual time too).
func skewNotes(sc *simulations.Scenario, t timing) (applied, notApplied, warnings []string) {
	var lo, hi time.Duration
	for r := range sc.Regions {
		off := clockOffset(sc, r, t.scale)
		lo, hi = min(lo, off), max(hi, off)
		if off != 0 {
			applied = append(applied, fmt.Sprintf("clock_skew_ms.%s (%d ms): --clock-offset %v on its coordinator and gateway (the skew / time scale %d)", sc.Regions[r], sc.ClockSkewMs[r], off, t.scale))
		}
	}
	if len(applied) == 0 {
		return nil, nil, nil
	}
	notApplied = []string{"clock_skew_ms: the skewed regions' redis-server keeps the machine's clock (its token buckets refill by differences of it, which an offset does not change; share records expire at their absolute time by it)"}
	if budget := t.epoch - t.collect - t.maxWait; hi-lo >= budget {
		warnings = append(warnings, fmt.Sprintf("clock_skew_ms: the clocks are %v apart (real), not less than the epoch %v minus the collect delay %v and the max wait %v: the protocol assumes less (rebalancer package doc), here and in virtual time", hi-lo, t.epoch, t.collect, t.maxWait))
	}
	return applied, notApplied, warnings
}
