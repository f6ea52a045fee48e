package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/netlab"
	"github.com/quotientlabs/quotient/limiter"
)

// faultFor is how long the faults of the resilience tests last (a region
// cut off, the broker cut off): QUOTIENT_E2E_FAULT_FOR, a Go duration
// (scripts/e2e-faults.sh sets 10m), else short, the default of make test.
func faultFor(t *testing.T, short time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv("QUOTIENT_E2E_FAULT_FOR")
	if v == "" {
		return short
	}
	d, err := time.ParseDuration(v)
	require.NoError(t, err, "QUOTIENT_E2E_FAULT_FOR must be a Go duration such as 10m")
	require.GreaterOrEqual(t, d, 10*time.Second, "QUOTIENT_E2E_FAULT_FOR must be at least 10s")
	return d
}

// labRegion is one region of a labDeployment: a host with its
// redis-server, quotient coordinator and quotient gateway.
type labRegion struct {
	name  string
	host  *netlab.Host
	redis *redis.Client // from the test process, through the bridge

	mu        sync.Mutex
	redisProc *proc
	restarts  int

	coordinator string // base URL
	gateway     string // base URL
	gatewayProc *proc
	gatewayArgs []string // the gateway's command line after the binary, for restartGateway
	gateways    int      // gateway processes started
}

// labDeployment is the deployment of TestBinariesRegionCutOff and the
// other resilience tests: every region its own host (netlab), the broker
// on a host of its own, policies from a file.
type labDeployment struct {
	t        *testing.T
	dir      string
	quotient string // the quotient binary
	lab      *netlab.Lab
	broker   *netlab.Host
	regions  map[string]*labRegion
	upstream string
}

const labRedisPort = 6379

// deployLab starts the broker, then the regions (names of the package's
// regions) with the policies and keys documents given (JSON), the
// gateways with extra flags gatewayArgs, and waits until every
// coordinator and gateway is ready. It skips the test when the machine
// cannot build network namespaces.
func deployLab(t *testing.T, policiesJSON, keysJSON string, gatewayArgs ...string) *labDeployment {
	t.Helper()
	if err := netlab.Available(); err != nil {
		t.Skipf("this machine lacks what network namespaces need: %v", err)
	}
	d := &labDeployment{t: t, dir: t.TempDir(), regions: map[string]*labRegion{}}
	quotient, devkafka := bin(t, "quotient"), bin(t, "devkafka")
	d.quotient = quotient
	d.lab = netlab.New(t) // atomic within the process: parallel labs never share a subnet
	d.broker = d.lab.AddHost("broker")
	broker := startCmd(t, d.dir, "devkafka", d.broker.Command(context.Background(), devkafka, "--listen", d.broker.Addr(9092)))
	kafka := broker.waitLog(t, regexpFor(d.broker.Addr(9092)), 20*time.Second)

	policies := filepath.Join(d.dir, "policies.json")
	require.NoError(t, os.WriteFile(policies, []byte(policiesJSON), 0o600))
	keys := filepath.Join(d.dir, "keys.json")
	require.NoError(t, os.WriteFile(keys, []byte(keysJSON), 0o600))

	// The upstream runs in the test process (root namespace): the hosts
	// reach it on the lab's bridge address.
	d.upstream = upstreamOn(t, d.lab.Gateway()+":0")
	for _, name := range regions {
		h := d.lab.AddHost(name)
		r := &labRegion{name: name, host: h}
		d.regions[name] = r
		d.startRedis(r)
		c := redis.NewClient(&redis.Options{Addr: h.Addr(labRedisPort)})
		t.Cleanup(func() { _ = c.Close() })
		r.redis = c
		startCmd(t, d.dir, "coordinator-"+name, h.Command(context.Background(), quotient, "coordinator",
			"--region", name, "--regions", strings.Join(regions, ","), "--redis", h.Addr(labRedisPort), "--kafka", kafka,
			"--listen", h.Addr(9090), "--epoch", epoch.String(), "--policies", policies))
		r.coordinator = "http://" + h.Addr(9090)
		args := append([]string{"gateway",
			"--listen", h.Addr(8080), "--upstream", d.upstream, "--redis", h.Addr(labRedisPort), "--region", name, "--regions", strings.Join(regions, ","),
			"--epoch", epoch.String(), "--usage-flush", usageFlush.String(), "--policies", policies, "--keys", keys}, gatewayArgs...)
		r.gatewayArgs = args
		d.startGateway(r)
		r.gateway = "http://" + h.Addr(8080)
	}
	for _, name := range regions {
		waitHTTP(t, d.regions[name].coordinator+"/readyz", 60*time.Second, nil)
		waitHTTP(t, d.regions[name].gateway+"/readyz", 30*time.Second, nil) // warm: no request is decided before
	}
	return d
}

// readyz is the status and (the first 512 bytes of) the body of the
// region's gateway's /readyz, or the error of the request (1 s timeout).
func (r *labRegion) readyz() string {
	c := &http.Client{Timeout: time.Second}
	resp, err := c.Get(r.gateway + "/readyz")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return fmt.Sprintf("%d %s", resp.StatusCode, b)
}

// startGateway starts the region's gateway (again, after restartGateway)
// with its flags and returns once it listens.
func (d *labDeployment) startGateway(r *labRegion) {
	d.t.Helper()
	name := "gateway-" + r.name
	if r.gateways > 0 {
		name += fmt.Sprintf("-%d", r.gateways)
	}
	r.gateways++
	r.gatewayProc = startCmd(d.t, d.dir, name, r.host.Command(context.Background(), d.quotient, r.gatewayArgs...))
	r.gatewayProc.waitLog(d.t, regexpFor("listening on "+r.host.Addr(8080)), 30*time.Second)
}

// restartGateway ends the region's gateway with sig (SIGTERM: a rolling
// deploy, which drains and flushes; SIGKILL: a crash, which loses the
// usage not yet flushed), waits until it has exited (15 s at most) and
// starts it again with the same flags (startGateway). Only the test's own
// goroutine may call it.
func (d *labDeployment) restartGateway(r *labRegion, sig syscall.Signal) {
	d.t.Helper()
	p := r.gatewayProc
	// ip netns exec execs quotient, so the process is the gateway itself.
	require.NoError(d.t, p.cmd.Process.Signal(sig))
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		d.t.Fatalf("%s did not exit within 15 s of %v", p.name, sig)
	}
	d.startGateway(r)
}

// startRedis starts (or, after killRedis, starts again, empty: no
// persistence) the region's redis-server on its host.
func (d *labDeployment) startRedis(r *labRegion) {
	d.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	name := "redis-" + r.name
	if r.restarts > 0 {
		name += fmt.Sprintf("-%d", r.restarts)
	}
	r.restarts++
	p := startCmd(d.t, d.dir, name, r.host.Command(context.Background(), "redis-server", "--bind", r.host.IP, "--port", strconv.Itoa(labRedisPort), "--save", "", "--appendonly", "no", "--protected-mode", "no"))
	p.waitLog(d.t, regexp.MustCompile(`(Ready to accept connections)`), 20*time.Second)
	r.redisProc = p
}

// killRedis ends the region's redis-server with SIGKILL (a crash: its
// data is gone) and waits until it has exited.
func (d *labDeployment) killRedis(r *labRegion) {
	d.t.Helper()
	r.mu.Lock()
	p := r.redisProc
	r.mu.Unlock()
	// ip netns exec execs redis-server, so the process is redis-server.
	require.NoError(d.t, p.cmd.Process.Kill())
	<-p.done
}

// gateways is region -> gateway base URL, for sendFlows.
func (d *labDeployment) gateways() map[string]string {
	gw := map[string]string{}
	for name, r := range d.regions {
		gw[name] = r.gateway
	}
	return gw
}

// shareSampler reads the share record of one global token bucket (key,
// policy id, global rate per second) from every region's Redis every
// 100 ms and counts the samples where Σ of what the regions enforce
// exceeds the global rate. A region without a record enforces 1/n of the
// rate; a sample in which a Redis does not answer is incomplete (counted
// apart, not checked).
type shareSampler struct {
	samples, violations, incomplete atomic.Int64
	first                           atomic.Value
	stop                            func()
	wg                              sync.WaitGroup
}

func (d *labDeployment) sampleShares(t0 time.Time, key, policyID string, rate float64) *shareSampler {
	s := &shareSampler{}
	ctx, stop := context.WithCancel(context.Background())
	s.stop = func() { stop(); s.wg.Wait() }
	d.t.Cleanup(s.stop)
	shareKey := limiter.ShareKey(limiter.Subject{Kind: limiter.SubjectAPIKey, Value: key}, policyID)
	limit := int64(rate * 1000)
	s.wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			var sum int64
			var parts []string
			complete := true
			for _, name := range regions {
				cctx, cancel := context.WithTimeout(ctx, time.Second)
				m, err := d.regions[name].redis.HGetAll(cctx, shareKey).Result()
				cancel()
				if err != nil {
					complete = false
					break
				}
				r := limit / int64(len(regions))
				if v, err := strconv.ParseInt(m["r"], 10, 64); err == nil {
					r = v
				}
				sum += r
				parts = append(parts, fmt.Sprintf("%s=%d", name, r))
			}
			if !complete {
				if ctx.Err() == nil {
					s.incomplete.Add(1)
				}
				continue
			}
			s.samples.Add(1)
			if sum > limit && s.violations.Add(1) == 1 {
				s.first.Store(fmt.Sprintf("at %v: %d > %d milli (%s)", time.Since(t0).Round(100*time.Millisecond), sum, limit, strings.Join(parts, ", ")))
			}
		}
	})
	return s
}

// metricSample is one sample line of a Prometheus text exposition.
type metricSample struct {
	line   string // the whole line
	series string // its name and labels
	value  string // its value, as written
}

// scrapeMetrics reads the Prometheus text at url (the request bounded by
// timeout) and returns its samples in order; comment lines are skipped.
func scrapeMetrics(url string, timeout time.Duration) ([]metricSample, error) {
	c := &http.Client{Timeout: timeout}
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out []metricSample
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "#") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		out = append(out, metricSample{line: l, series: l[:i], value: l[i+1:]})
	}
	return out, sc.Err()
}

// metricValues scrapes the Prometheus text at url and returns the value
// of every sample whose line (name and labels) matches re, keyed by that
// line's name and labels. A scrape that fails, or a matching value that
// does not parse, fails the test (call it from the test's goroutine).
func metricValues(t *testing.T, url string, re *regexp.Regexp) map[string]float64 {
	t.Helper()
	samples, err := scrapeMetrics(url, 2*time.Second)
	require.NoError(t, err)
	out := map[string]float64{}
	for _, s := range samples {
		if !re.MatchString(s.series) {
			continue
		}
		v, err := strconv.ParseFloat(s.value, 64)
		require.NoError(t, err, "metrics %s: %q", url, s.line)
		out[s.series] = v
	}
	return out
}

// metricSum is the sum of metricValues.
func metricSum(t *testing.T, url string, re *regexp.Regexp) float64 {
	t.Helper()
	var sum float64
	for _, v := range metricValues(t, url, re) {
		sum += v
	}
	return sum
}
