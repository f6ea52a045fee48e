package deployed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/quotientlabs/quotient/internal/netlab"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/simulations"
)

// Fixed ports inside every host (each host has its own namespace).
const (
	redisPort       = 6379
	coordinatorPort = 9090
	gatewayPort     = 8080
	brokerPort      = 9092
)

// usageTopic is the coordinators' usage-report topic (their --topic
// default), the one the broker loses and duplicates reports on.
const usageTopic = "quotient.usage"

type regionRun struct {
	name        string
	host        *netlab.Host
	redis       *proc
	coordinator *proc
	gateway     *proc
	client      *redis.Client // to its redis-server, from the root namespace
	http        *http.Client
	queue       chan work
}

type work struct {
	due time.Time
	req simulations.Request
}

type entryInfo struct {
	route   string
	cost    int64
	keys    []string
	tracked [][]int // per key: recorder indexes, one per policy
}

type namedKey struct {
	k       int
	subject limiter.Subject
	policy  *limiter.Policy
}

type run struct {
	sc      *simulations.Scenario
	cfg     Config
	t       timing
	dir     string
	lab     *netlab.Lab
	broker  *netlab.Host
	devk    *proc
	proxies []*toxiproxy.Proxy
	regions []*regionRun
	entries []entryInfo
	named   []namedKey
	start   time.Time

	mu  sync.Mutex // guards rec
	rec *simulations.Recorder

	requests, errs, late, maxLateNs atomic.Int64
	lastErr                         atomic.Value

	errMu sync.Mutex
	err   error
}

func (r *run) fail(err error) {
	r.errMu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.errMu.Unlock()
}

func (r *run) logf(format string, args ...any) {
	if r.cfg.Logf != nil {
		r.cfg.Logf(format, args...)
	}
}

// Run runs sc on the shipped binaries (see the package doc) and returns
// the same Report the virtual-time engine does (Wall filled) with the
// run's Stats. It blocks for about HeadStartEpochs epochs plus duration_s
// / TimeScale seconds, plus the start-up of the processes. A scenario
// deployed mode cannot run fails with a *simulations.ScenarioError
// (Check); a machine without root, ip, nft, redis-server or the binaries
// with ErrUnavailable; a bad cfg with ErrConfig; anything else with
// ErrRun (the processes' logs stay in Stats.Dir). ctx cancels the run.
// Everything the run starts is stopped and removed before it returns.
func Run(ctx context.Context, sc *simulations.Scenario, cfg Config) (*simulations.Report, Stats, error) {
	wallStart := time.Now()
	if err := Check(sc); err != nil {
		return nil, Stats{}, err
	}
	t, err := cfg.validate(sc)
	if err != nil {
		return nil, Stats{}, err
	}
	if err := Available(cfg); err != nil {
		return nil, Stats{}, err
	}
	if err := cfg.findBinaries(); err != nil {
		return nil, Stats{}, err
	}
	r := &run{sc: sc, cfg: cfg, t: t, rec: simulations.NewRecorder(sc)}
	st := Stats{TimeScale: cfg.TimeScale, Fallback: -1}
	st.Applied, st.NotApplied, st.Warnings = skewNotes(sc, t)
	r.dir = cfg.Dir
	temp := r.dir == ""
	if temp {
		if r.dir, err = os.MkdirTemp("", "quotient-deployed-"); err != nil {
			return nil, st, fmt.Errorf("%w: %v", ErrRun, err)
		}
	} else if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return nil, st, fmt.Errorf("%w: %v", ErrRun, err)
	}
	st.Dir = r.dir
	err = r.setup(ctx)
	if err == nil {
		err = r.execute(ctx)
	}
	st.Fallback = r.fallbacks()
	r.close()
	if err != nil {
		return nil, st, err
	}
	if temp {
		_ = os.RemoveAll(r.dir)
		st.Dir = ""
	}
	rep := r.rec.Report(r.start.Unix())
	rep.Wall = time.Since(wallStart)
	st.Start, st.Requests, st.Errors = r.start, r.requests.Load(), r.errs.Load()
	st.Late, st.MaxLateness = r.late.Load(), time.Duration(r.maxLateNs.Load())
	if v, ok := r.lastErr.Load().(string); ok {
		st.LastError = v
	}
	return rep, st, nil
}

// setup builds the lab and starts every process, ready to serve.
func (r *run) setup(ctx context.Context) error {
	sc := r.sc
	pol, err := policyDocs(sc, r.t.scale)
	if err != nil {
		return err
	}
	keys, err := keyDoc(sc)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrRun, err)
	}
	polFile, keyFile := filepath.Join(r.dir, "policies.json"), filepath.Join(r.dir, "keys.json")
	if err := os.WriteFile(polFile, pol, 0o644); err != nil {
		return fmt.Errorf("%w: %v", ErrRun, err)
	}
	if err := os.WriteFile(keyFile, keys, 0o644); err != nil {
		return fmt.Errorf("%w: %v", ErrRun, err)
	}
	r.track()

	if r.lab, err = netlab.Open(); err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if r.broker, err = r.lab.NewHost("broker"); err != nil {
		return fmt.Errorf("%w: %v", ErrRun, err)
	}
	r.devk = &proc{name: "devkafka", host: r.broker.Command, log: filepath.Join(r.dir, "devkafka.log"),
		args: []string{r.cfg.Devkafka, "--listen", r.broker.Addr(brokerPort)}}
	if n := sc.Network; n.Loss > 0 || n.Duplicate > 0 {
		r.devk.args = append(r.devk.args, "--drop-produce", strconv.FormatFloat(n.Loss, 'g', -1, 64),
			"--duplicate-produce", strconv.FormatFloat(n.Duplicate, 'g', -1, 64),
			"--fault-topic", usageTopic, "--fault-seed", strconv.FormatUint(uint64(sc.Seed), 10))
	}
	if err := r.devk.start(); err != nil {
		return err
	}
	if _, err := r.devk.waitLog(ctx, regexp.MustCompile(regexp.QuoteMeta(r.broker.Addr(brokerPort))), 30*time.Second); err != nil {
		return err
	}

	// The upstream every gateway forwards to, in this process.
	ln, err := net.Listen("tcp", r.lab.Gateway()+":0")
	if err != nil {
		return fmt.Errorf("%w: upstream: %v", ErrRun, err)
	}
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = up.Serve(ln) }()
	context.AfterFunc(ctx, func() { _ = up.Close() })
	upURL := "http://" + ln.Addr().String()

	// One proxy per region on the way to the broker.
	tp := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	lat := func(ms float64) int64 { return int64(ms/2/float64(r.t.scale) + 0.5) }
	for ri, name := range sc.Regions {
		h, err := r.lab.NewHost(name)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrRun, err)
		}
		p := toxiproxy.NewProxy(tp, "broker-"+name, r.lab.Gateway()+":0", r.broker.Addr(brokerPort))
		if err := p.Start(); err != nil {
			return fmt.Errorf("%w: proxy of %s: %v", ErrRun, name, err)
		}
		r.proxies = append(r.proxies, p)
		if l := lat(sc.Network.LatencyMs); l > 0 || lat(sc.Network.JitterMs) > 0 {
			for _, stream := range []string{"upstream", "downstream"} {
				doc := fmt.Sprintf(`{"name":"latency_%s","type":"latency","stream":%q,"toxicity":1,"attributes":{"latency":%d,"jitter":%d}}`, stream, stream, l, lat(sc.Network.JitterMs))
				if _, err := p.Toxics.AddToxicJson(strings.NewReader(doc)); err != nil {
					return fmt.Errorf("%w: latency of %s: %v", ErrRun, name, err)
				}
			}
		}
		if err := h.Redirect(r.broker, brokerPort, p.Listen); err != nil {
			return fmt.Errorf("%w: %v", ErrRun, err)
		}
		rr := &regionRun{name: name, host: h, queue: make(chan work, 1<<16)}
		rr.redis = &proc{name: "redis-" + name, host: h.Command, log: filepath.Join(r.dir, "redis-"+name+".log"),
			args: []string{"redis-server", "--bind", h.IP, "--port", strconv.Itoa(redisPort), "--save", "", "--appendonly", "no", "--protected-mode", "no"}}
		rr.coordinator = &proc{name: "coordinator-" + name, host: h.Command, log: filepath.Join(r.dir, "coordinator-"+name+".log"),
			args: []string{r.cfg.Quotient, "coordinator", "--region", name, "--regions", join(sc.Regions),
				"--redis", h.Addr(redisPort), "--kafka", r.broker.Addr(brokerPort), "--listen", h.Addr(coordinatorPort),
				"--epoch", r.t.epoch.String(), "--max-wait", r.t.maxWait.String(), "--collect-delay", r.t.collect.String(),
				"--pressure-interval", r.t.flush.String(),
				"--topic", usageTopic, "--policies", polFile}}
		rr.gateway = &proc{name: "gateway-" + name, host: h.Command, log: filepath.Join(r.dir, "gateway-"+name+".log"),
			args: []string{r.cfg.Quotient, "gateway", "--listen", h.Addr(gatewayPort), "--upstream", upURL,
				"--redis", h.Addr(redisPort), "--region", name, "--regions", join(sc.Regions),
				"--epoch", r.t.epoch.String(), "--usage-flush", r.t.flush.String(), "--timeout", r.cfg.StoreDeadline.String(),
				"--policies", polFile, "--keys", keyFile}}
		// The region's clock skew, on both processes that read the clock
		// for the protocol (epochs, fences, usage epochs).
		if off := clockOffset(sc, ri, r.t.scale); off != 0 {
			for _, p := range []*proc{rr.coordinator, rr.gateway} {
				p.args = append(p.args, "--clock-offset", off.String())
			}
		}
		rr.client = redis.NewClient(&redis.Options{Addr: h.Addr(redisPort)})
		rr.http = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: r.cfg.Workers, MaxConnsPerHost: r.cfg.Workers}}
		r.regions = append(r.regions, rr)
		for _, p := range []*proc{rr.redis, rr.coordinator, rr.gateway} {
			if err := p.start(); err != nil {
				return err
			}
		}
	}
	for _, rr := range r.regions {
		if err := waitHTTP(ctx, "http://"+rr.host.Addr(coordinatorPort)+"/readyz", 60*time.Second); err != nil {
			return fmt.Errorf("%w (log: %s)", err, tail(rr.coordinator.log, 10))
		}
		if err := waitHTTP(ctx, "http://"+rr.host.Addr(gatewayPort)+"/readyz", 60*time.Second); err != nil {
			return fmt.Errorf("%w (log: %s)", err, tail(rr.gateway.log, 10))
		}
	}
	r.logf("deployed: %d regions up (lab %s, broker %s)", len(r.regions), r.lab.Gateway(), r.broker.Addr(brokerPort))
	return nil
}

// track registers every (key, policy) with the recorder in the engine's
// order and notes the named ones, whose shares are sampled.
func (r *run) track() {
	byID := map[string]*limiter.Policy{}
	for _, p := range r.sc.Policies {
		byID[p.ID] = p
	}
	seen := map[int]bool{}
	for i := range r.sc.Traffic {
		tr := &r.sc.Traffic[i]
		e := entryInfo{route: route(i), cost: tr.Cost}
		for _, name := range tr.KeyNames() {
			e.keys = append(e.keys, name)
			var ks []int
			for _, id := range tr.Policies {
				p := byID[id]
				k := r.rec.Track(name, p, tr.Named())
				ks = append(ks, k)
				if tr.Named() && !seen[k] {
					seen[k] = true
					r.named = append(r.named, namedKey{k: k, subject: limiter.Subject{Kind: p.Subject, Value: name}, policy: p})
				}
			}
			e.tracked = append(e.tracked, ks)
		}
		r.entries = append(r.entries, e)
	}
}

// execute waits for t=0, replays the schedule in scaled real time through
// the gateways, applies faults and partitions on time and samples shares
// every scenario second.
func (r *run) execute(ctx context.Context) error {
	epochNs := int64(r.t.epoch)
	now := time.Now().UnixNano()
	k := (now+int64(r.cfg.HeadStartEpochs)*epochNs)/epochNs + 1
	r.start = time.Unix(0, k*epochNs)
	r.logf("deployed: t=0 at %s (in %v)", r.start.UTC().Format(time.RFC3339Nano), time.Until(r.start).Round(time.Millisecond))
	if !simulations.SleepUntil(ctx, r.start) {
		return fmt.Errorf("%w: %v", ErrRun, ctx.Err())
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for ri, rr := range r.regions {
		for range r.cfg.Workers {
			wg.Go(func() { r.worker(runCtx, ri, rr) })
		}
	}
	var bg sync.WaitGroup
	bg.Go(func() { r.sample(runCtx) })
	bg.Go(func() { r.faults(runCtx) })

	_ = simulations.Pace(ctx, r.sc, r.start, r.t.scale, func(due time.Time, req simulations.Request) bool {
		select {
		case r.regions[req.Region].queue <- work{due: due, req: req}:
			return true
		case <-ctx.Done():
			return false
		}
	})
	for _, rr := range r.regions {
		close(rr.queue)
	}
	wg.Wait()
	bg.Wait()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %v", ErrRun, err)
	}
	r.errMu.Lock()
	defer r.errMu.Unlock()
	return r.err
}

// worker sends the requests of one region's queue to its gateway and
// records the answers.
func (r *run) worker(ctx context.Context, ri int, rr *regionRun) {
	base := "http://" + rr.host.Addr(gatewayPort)
	for w := range rr.queue {
		late := time.Since(w.due)
		for {
			cur := r.maxLateNs.Load()
			if int64(late) <= cur || r.maxLateNs.CompareAndSwap(cur, int64(late)) {
				break
			}
		}
		if late > r.t.second {
			r.late.Add(1)
		}
		e := &r.entries[w.req.Traffic]
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+e.route, nil)
		if err != nil {
			r.fail(fmt.Errorf("%w: %v", ErrRun, err))
			continue
		}
		req.Header.Set("X-API-Key", e.keys[w.req.Key])
		resp, err := rr.http.Do(req)
		if err != nil {
			r.errs.Add(1)
			r.lastErr.Store(err.Error())
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		var admitted bool
		switch resp.StatusCode {
		case http.StatusOK:
			admitted = true
		case http.StatusTooManyRequests:
		default:
			r.errs.Add(1)
			r.lastErr.Store(rr.name + ": " + resp.Status)
			continue
		}
		r.requests.Add(1)
		sec := w.req.AtNs / int64(time.Second)
		r.mu.Lock()
		for _, k := range e.tracked[w.req.Key] {
			r.rec.Record(k, ri, sec, e.cost, admitted)
		}
		r.rec.Decision()
		r.mu.Unlock()
	}
}

// sample records, at the end of every scenario second, the share each
// region enforces for every named key (from its Redis; absent or
// unreadable means the default L/n), in scenario units.
func (r *run) sample(ctx context.Context) {
	n := int64(len(r.regions))
	total := r.sc.DurationSec
	for s := range total {
		if !simulations.SleepUntil(ctx, r.start.Add(time.Duration(s+1)*r.t.second)) {
			return
		}
		vals := make([][]int64, len(r.regions))
		for ri, rr := range r.regions {
			vals[ri] = r.readShares(ctx, rr)
		}
		r.mu.Lock()
		for i, nk := range r.named {
			for ri := range r.regions {
				share := vals[ri][i]
				if share < 0 {
					share = max(1, nk.policy.RateMilli()/n)
				}
				r.rec.RecordShare(nk.k, ri, s, share)
			}
		}
		r.mu.Unlock()
		if r.cfg.Progress != nil {
			r.cfg.Progress(s+1, total)
		}
	}
}

func (r *run) readShares(ctx context.Context, rr *regionRun) []int64 {
	out := make([]int64, len(r.named))
	if len(r.named) == 0 {
		return out
	}
	rctx, cancel := context.WithTimeout(ctx, r.t.second)
	defer cancel()
	pipe := rr.client.Pipeline()
	cmds := make([]*redis.SliceCmd, len(r.named))
	for i, nk := range r.named {
		cmds[i] = pipe.HMGet(rctx, limiter.ShareKey(nk.subject, nk.policy.ID), "r")
	}
	_, _ = pipe.Exec(rctx)
	for i, c := range cmds {
		out[i] = -1
		if res, err := c.Result(); err == nil && len(res) == 1 {
			if str, ok := res[0].(string); ok {
				if x, err := strconv.ParseInt(str, 10, 64); err == nil {
					out[i] = x / r.t.scale
				}
			}
		}
	}
	return out
}

// action is one change of the deployment at a scenario time.
type action struct {
	atSec float64
	what  string
	do    func() error
}

// faults applies the scenario's faults and partitions at their times.
func (r *run) faults(ctx context.Context) {
	var acts []action
	for _, f := range r.sc.Faults {
		rr := r.regions[f.Region]
		p := rr.coordinator
		if f.Kind == simulations.StoreDown {
			p = rr.redis
		}
		acts = append(acts,
			action{f.FromSec, fmt.Sprintf("%s: SIGKILL %s", f.Kind, p.name), func() error { p.kill(); return nil }},
			action{f.ToSec, fmt.Sprintf("%s over: restart %s", f.Kind, p.name), p.start})
	}
	for _, pt := range r.sc.Network.Partitions {
		in := map[int]bool{}
		for _, ri := range pt.Regions {
			in[ri] = true
		}
		var inside, outside []*netlab.Host
		outside = append(outside, r.broker)
		var names []string
		for ri, rr := range r.regions {
			if in[ri] {
				inside = append(inside, rr.host)
				names = append(names, rr.name)
			} else {
				outside = append(outside, rr.host)
			}
		}
		acts = append(acts,
			action{pt.FromSec, "partition: cut " + strings.Join(names, ",") + " off", func() error {
				for _, h := range inside {
					if err := h.Block(outside...); err != nil {
						return err
					}
				}
				return nil
			}},
			action{pt.ToSec, "partition over: heal " + strings.Join(names, ","), func() error {
				var errs []error
				for _, h := range inside {
					errs = append(errs, h.Unblock())
				}
				return errors.Join(errs...)
			}})
	}
	sort.SliceStable(acts, func(i, j int) bool { return acts[i].atSec < acts[j].atSec })
	for _, a := range acts {
		if a.atSec >= float64(r.sc.DurationSec) {
			continue
		}
		at := r.start.Add(time.Duration(a.atSec * float64(time.Second) / float64(r.t.scale)))
		if !simulations.SleepUntil(ctx, at) {
			return
		}
		r.logf("deployed: t=%vs %s", a.atSec, a.what)
		if err := a.do(); err != nil {
			r.fail(fmt.Errorf("%w: %s: %v", ErrRun, a.what, err))
		}
	}
}

// fallbacks sums the gateways' fallback decisions (-1 when unreadable).
func (r *run) fallbacks() int64 {
	var sum int64
	c := &http.Client{Timeout: 5 * time.Second}
	for _, rr := range r.regions {
		if rr.gateway == nil || !rr.gateway.running() {
			return -1
		}
		resp, err := c.Get("http://" + rr.host.Addr(gatewayPort) + "/metrics")
		if err != nil {
			return -1
		}
		data, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		for _, l := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(l, "quotient_limiter_fallback_decisions_total") {
				f := strings.Fields(l)
				if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
					sum += int64(v)
				}
			}
		}
	}
	return sum
}

// close stops every process and proxy and removes the lab.
func (r *run) close() {
	for _, rr := range r.regions {
		for _, p := range []*proc{rr.gateway, rr.coordinator, rr.redis} {
			p.stop()
		}
		_ = rr.client.Close()
		rr.http.CloseIdleConnections()
	}
	if r.devk != nil {
		r.devk.stop()
	}
	for _, p := range r.proxies {
		p.Stop()
	}
	if r.lab != nil {
		r.lab.Close()
	}
}
