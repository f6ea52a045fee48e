package rebalancer_test

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotientlabs/quotient/limiter"
)

// Phases of the gateway probe (benchEpoch): between collections (only
// the probe), the coordinator reading usage, its CPU-only phases
// (collect, publish, consume, decide), its share writes, and the
// benchmark's setup of the next epoch (the gateways' usage flushes).
const (
	probeBetween int32 = iota
	probeRead
	probeCoordinator
	probeWrite
	probeFlush
)

var probeNames = []string{"between", "read", "coordinator", "write", "flush"}

// probeClient is the probe's client name (CLIENT SETNAME), by which its
// own commands are told apart in SLOWLOG.
const probeClient = "gateway-probe"

// probeChildEnv, set to a redis-server address, makes the test binary run
// only the gateway probe against it (runProbeChild) instead of its tests:
// startProbe runs the probe that way, in a process of its own, as a
// gateway is.
const probeChildEnv = "QUOTIENT_BENCH_PROBE_CHILD"

// probeEvery is how often the probe checks.
const probeEvery = 2 * time.Millisecond

func TestMain(m *testing.M) {
	if addr := os.Getenv(probeChildEnv); addr != "" {
		if err := runProbeChild(addr, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "gateway probe:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runProbeChild checks one API key through a limiter on a RedisStore of
// its own client to addr every probeEvery, writing a line "END DUR" per
// check (its end, unix ns, and its latency, ns) to out, until in reaches
// its end.
func runProbeChild(addr string, in io.Reader, out io.Writer) error {
	pols, err := limiter.ParsePolicies([]byte(`[{"id": "probe", "subject": "api_key",
		"algorithm": "token_bucket", "rate_per_sec": 1000000, "burst": 1000000}]`))
	if err != nil {
		return err
	}
	c := redis.NewClient(&redis.Options{Addr: addr, ClientName: probeClient})
	defer c.Close()
	l, err := limiter.New(limiter.Config{Store: limiter.NewRedisStore(c), Deadline: time.Minute,
		Breaker: limiter.BreakerConfig{Disabled: true}}, pols)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _, _ = io.Copy(io.Discard, in); cancel() }()
	w := bufio.NewWriter(out)
	subj := limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "probe"}
	tk := time.NewTicker(probeEvery)
	defer tk.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return w.Flush()
		case <-tk.C:
		}
		t0 := time.Now()
		_, err := l.Allow(ctx, subj, pols...)
		t1 := time.Now()
		if err != nil {
			if ctx.Err() != nil {
				return w.Flush()
			}
			return err
		}
		fmt.Fprintf(w, "%d %d\n", t1.UnixNano(), t1.Sub(t0).Nanoseconds())
		if n%16 == 15 { // about every 32 ms: the parent files lines as they come
			if err := w.Flush(); err != nil {
				return err
			}
		}
	}
}

// probe is a gateway-like Check loop against redis-server in a process
// of its own (startProbe), whose latencies are filed by the phase of the
// benchmark in which each check ended. The probe's checks and the
// benchmark's phases are matched by the wall clock both processes read.
type probe struct {
	mu    sync.Mutex
	marks []probeMark // phase changes, in order
	since int64       // unix ns of the last reset: earlier checks are dropped
	lat   [5][]time.Duration
	bad   error // the first unparsable line
	stop  func()
}

type probeMark struct {
	at int64 // unix ns
	ph int32
}

// probeCPUsEnv names the environment variable that, set to a taskset CPU
// list, runs the probe process on those CPUs; unset, it inherits the
// benchmark's (under taskset -c 1 with redistest.PinCPUsEnv=0, the
// coordinator's core, where it does not preempt redis-server).
const probeCPUsEnv = "QUOTIENT_BENCH_PROBE_CPUS"

// startProbe starts the probe process (this test binary with
// probeChildEnv) against addr, on the CPUs of probeCPUsEnv when it is
// set. Its allocations and collections are its own, as a gateway's are.
func startProbe(ctx context.Context, b *testing.B, addr string) *probe {
	exe, err := os.Executable()
	if err != nil {
		b.Fatalf("gateway probe: %v", err)
	}
	name, args := exe, []string{}
	if cpus := os.Getenv(probeCPUsEnv); cpus != "" {
		name, args = "taskset", []string{"-c", cpus, exe}
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), probeChildEnv+"="+addr)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatalf("gateway probe: %v", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatalf("gateway probe: %v", err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatalf("gateway probe: %v", err)
	}
	p := &probe{marks: []probeMark{{at: time.Now().UnixNano(), ph: probeFlush}}}
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			end, dur, err := parseProbeLine(sc.Text())
			if err != nil {
				p.mu.Lock()
				p.bad = cmp.Or(p.bad, err)
				p.mu.Unlock()
				continue
			}
			p.file(end, dur)
		}
	}()
	p.stop = func() {
		_ = stdin.Close()
		<-read
		if err := cmd.Wait(); err != nil && ctx.Err() == nil {
			b.Errorf("gateway probe: %v", err)
		}
		if p.bad != nil { // the reader is done
			b.Errorf("gateway probe: %v", p.bad)
		}
	}
	return p
}

func parseProbeLine(line string) (end int64, dur time.Duration, err error) {
	a, c, ok := strings.Cut(line, " ")
	if !ok {
		return 0, 0, fmt.Errorf("line %q is not END DUR", line)
	}
	end, err = strconv.ParseInt(a, 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("line %q: %w", line, err)
	}
	d, err := strconv.ParseInt(c, 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("line %q: %w", line, err)
	}
	return end, time.Duration(d), nil
}

// setPhase marks the start of phase ph now.
func (p *probe) setPhase(ph int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marks = append(p.marks, probeMark{at: time.Now().UnixNano(), ph: ph})
}

// file records a check that ended at end (unix ns) under the phase then.
func (p *probe) file(end int64, dur time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if end < p.since {
		return
	}
	i, _ := slices.BinarySearchFunc(p.marks, end, func(m probeMark, t int64) int {
		if m.at <= t {
			return -1
		}
		return 1
	})
	if i == 0 {
		return // before the first mark
	}
	ph := p.marks[i-1].ph
	p.lat[ph] = append(p.lat[ph], dur)
}

// reset drops every check so far (and those still in the pipe).
func (p *probe) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lat = [5][]time.Duration{}
	p.since = time.Now().UnixNano()
	p.marks = p.marks[len(p.marks)-1:]
}

// latencies returns the latencies of phase ph filed so far, sorted (the
// checks of the last few tens of milliseconds may still be in the pipe).
func (p *probe) latencies(ph int32) []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := slices.Clone(p.lat[ph])
	slices.Sort(out)
	return out
}
