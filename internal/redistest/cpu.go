package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNoSchedStat is returned by ThreadTimes where the kernel does not
// expose per-thread scheduler statistics (/proc/<pid>/task/<tid>/schedstat,
// Linux only); a test that needs them should skip.
var ErrNoSchedStat = errors.New("redistest: no per-thread scheduler statistics on this system")

// ThreadTimes is what the kernel counted for redis-server's main thread
// (the one that runs every command) since it started.
type ThreadTimes struct {
	// CPU is the time the thread ran on a CPU.
	CPU time.Duration
	// Preempted is how many times the kernel took the CPU from the thread
	// while it could still run (nonvoluntary context switches): each is a
	// moment redis-server was descheduled, which SLOWLOG counts into the
	// command that was running.
	Preempted int64
}

// MainThreadTimes returns the CPU time and preemption count of the
// server's main thread once it is idle (sleeping in its event loop, which
// makes the CPU figure exact: the kernel brings it up to date when the
// thread sleeps). It waits for that at most until ctx is done, and fails
// with ErrNoSchedStat off Linux. Differences of two readings taken around
// a command, with no other client on the server, are the command's own
// run time on redis-server, without the time the machine's load kept it
// off the CPU that SLOWLOG's wall-clock durations include. Safe for
// concurrent use; the server must be running.
func (s *Server) MainThreadTimes(ctx context.Context) (ThreadTimes, error) {
	s.mu.Lock()
	proc := s.proc
	s.mu.Unlock()
	if proc == nil {
		return ThreadTimes{}, fmt.Errorf("redistest: redis-server %s is stopped", s.addr)
	}
	pid := proc.cmd.Process.Pid
	dir := fmt.Sprintf("/proc/%d/task/%d/", pid, pid)
	if _, err := os.Stat(dir + "schedstat"); err != nil {
		return ThreadTimes{}, fmt.Errorf("%w: %v", ErrNoSchedStat, err)
	}
	for {
		stat, err := os.ReadFile(dir + "stat")
		if err != nil {
			return ThreadTimes{}, fmt.Errorf("redistest: %v", err)
		}
		// pid (comm) state ...: the state follows the last ')'.
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 || i+2 >= len(stat) {
			return ThreadTimes{}, fmt.Errorf("redistest: unexpected %sstat: %q", dir, stat)
		}
		if stat[i+2] == 'S' {
			break
		}
		select {
		case <-ctx.Done():
			return ThreadTimes{}, fmt.Errorf("redistest: redis-server %s not idle: %w", s.addr, ctx.Err())
		case <-time.After(50 * time.Microsecond):
		}
	}
	sched, err := os.ReadFile(dir + "schedstat")
	if err != nil {
		return ThreadTimes{}, fmt.Errorf("redistest: %v", err)
	}
	f := strings.Fields(string(sched))
	if len(f) < 1 {
		return ThreadTimes{}, fmt.Errorf("redistest: unexpected %sschedstat: %q", dir, sched)
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return ThreadTimes{}, fmt.Errorf("redistest: %sschedstat: %v", dir, err)
	}
	out := ThreadTimes{CPU: time.Duration(ns)}
	status, err := os.ReadFile(dir + "status")
	if err != nil {
		return ThreadTimes{}, fmt.Errorf("redistest: %v", err)
	}
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "nonvoluntary_ctxt_switches:"); ok {
			if out.Preempted, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64); err != nil {
				return ThreadTimes{}, fmt.Errorf("redistest: %sstatus: %q: %v", dir, line, err)
			}
		}
	}
	return out, nil
}

// PipelineCPU is a go-redis hook (client.AddHook) that records, for every
// pipeline the client sends, the CPU time the server's main thread spent
// on it (MainThreadTimes before and after; the server idle at both) and
// how often the kernel preempted the thread meanwhile. It measures only
// pipelines (single commands pass through untimed), and only what one
// client sends to one Server: give it a client of its own on a server no
// other client uses meanwhile, or the figures include their commands. Not
// safe for concurrent use: one pipeline at a time.
type PipelineCPU struct {
	srv *Server
	ctx context.Context
	// Rounds holds each pipeline's CPU time on the server, in order.
	Rounds []time.Duration
	// Preempted is how often the server's main thread was preempted
	// during the pipelines.
	Preempted int64
	// Err holds the errors of reading the thread's figures (the pipelines
	// themselves run regardless); check it is nil.
	Err error
}

// NewPipelineCPU returns a hook timing pipelines on s; ctx bounds each wait
// for the server to be idle.
func NewPipelineCPU(ctx context.Context, s *Server) *PipelineCPU {
	return &PipelineCPU{srv: s, ctx: ctx}
}

// Longest returns the longest of Rounds (0 when none).
func (h *PipelineCPU) Longest() time.Duration {
	var m time.Duration
	for _, d := range h.Rounds {
		m = max(m, d)
	}
	return m
}

// Total returns the sum of Rounds.
func (h *PipelineCPU) Total() time.Duration {
	var t time.Duration
	for _, d := range h.Rounds {
		t += d
	}
	return t
}

// DialHook implements redis.Hook.
func (h *PipelineCPU) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (h *PipelineCPU) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

// ProcessPipelineHook implements redis.Hook.
func (h *PipelineCPU) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		before, err := h.srv.MainThreadTimes(h.ctx)
		if err != nil {
			h.Err = errors.Join(h.Err, err)
			return next(ctx, cmds)
		}
		perr := next(ctx, cmds)
		after, err := h.srv.MainThreadTimes(h.ctx)
		if err != nil {
			h.Err = errors.Join(h.Err, err)
			return perr
		}
		h.Rounds = append(h.Rounds, after.CPU-before.CPU)
		h.Preempted += after.Preempted - before.Preempted
		return perr
	}
}

var _ redis.Hook = (*PipelineCPU)(nil)

// PinCPUsEnv names the environment variable that, when set to a taskset
// CPU list such as "0", makes PinFromEnv pin a benchmark's redis-server to
// those CPUs; the benchmark itself then runs on the others (taskset -c 1),
// so that Redis and its callers do not take each other's core.
const PinCPUsEnv = "QUOTIENT_BENCH_REDIS_CPUS"

// PinFromEnv pins every thread of the server to the CPUs of PinCPUsEnv
// with taskset, and does nothing when it is unset. It fails the test when
// taskset fails (a bad CPU list, no taskset). Safe for concurrent use; the
// server must be running.
func (s *Server) PinFromEnv(tb testing.TB) {
	cpus := os.Getenv(PinCPUsEnv)
	if cpus == "" {
		return
	}
	s.mu.Lock()
	proc := s.proc
	s.mu.Unlock()
	if proc == nil {
		tb.Fatalf("redistest: redis-server %s is stopped", s.addr)
	}
	out, err := exec.Command("taskset", "-a", "-pc", cpus, strconv.Itoa(proc.cmd.Process.Pid)).CombinedOutput()
	if err != nil {
		tb.Fatalf("redistest: %s=%s: taskset: %v: %s", PinCPUsEnv, cpus, err, out)
	}
}
