package live

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotientlabs/quotient/dailyquota/kafkarepl"
	"github.com/quotientlabs/quotient/internal/kafkautil"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/region"
	"github.com/quotientlabs/quotient/simulations"
)

// namedKey is a named (key, policy) whose shares are sampled every second.
type namedKey struct {
	k       int // recorder index
	subject limiter.Subject
	policy  *limiter.Policy // the scenario's (unscaled) policy
}

// setup builds the clients, gateways and coordinators, tracks the keys
// and creates the topic. It does no request.
func (r *run) setup(ctx context.Context) error {
	sc, scale := r.sc, r.t.scale
	scaled := make([]*limiter.Policy, len(sc.Policies))
	byID := map[string]int{}
	for i, p := range sc.Policies {
		q, err := derive(p, func(q *limiter.Policy) {
			q.Match = limiter.Match{} // the scenario names each entry's policies
			if q.Algorithm == limiter.TokenBucket || q.Algorithm == limiter.LeakyBucket {
				q.RatePerSec = p.RatePerSec * float64(scale)
			}
		})
		if err != nil {
			return fmt.Errorf("%w: policies[%d] times TimeScale %d: %v", ErrConfig, i, scale, err)
		}
		scaled[i] = q
		byID[p.ID] = i
	}

	// Keys, in the engine's tracking order, and their subjects.
	var named []namedKey
	sets := map[string][]*limiter.Policy{}
	for i := range sc.Traffic {
		tr := &sc.Traffic[i]
		e := entryInfo{policySet: strings.Join(tr.Policies, ","), cost: tr.Cost}
		if _, ok := sets[e.policySet]; !ok {
			for _, id := range tr.Policies {
				sets[e.policySet] = append(sets[e.policySet], scaled[byID[id]])
			}
		}
		for _, name := range tr.KeyNames() {
			subj := r.cfg.RunID + "/" + name
			e.subjects = append(e.subjects, subj)
			var ks []int
			for _, id := range tr.Policies {
				p := sc.Policies[byID[id]]
				k := r.rec.Track(name, p, tr.Named())
				ks = append(ks, k)
				if tr.Named() {
					named = append(named, namedKey{k: k, subject: limiter.Subject{Kind: p.Subject, Value: subj}, policy: p})
				}
			}
			e.tracked = append(e.tracked, ks)
		}
		r.entries = append(r.entries, e)
	}
	r.named = dedupe(named)

	// Regions: Redis, gateways.
	for _, name := range sc.Regions {
		addr := r.cfg.RedisAddrs[name]
		rr := &regionRun{name: name, gateways: map[string]*gateway{}, queue: make(chan work, 1<<14)}
		rr.client = redis.NewClient(&redis.Options{Addr: addr, PoolSize: r.cfg.Workers + 8})
		r.regions = append(r.regions, rr)
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := rr.client.Ping(pctx).Err()
		cancel()
		if err != nil {
			return fmt.Errorf("%w: redis of region %s at %s: %v", ErrRun, name, addr, err)
		}
		for set, pols := range sets {
			lc := limiter.DefaultConfig()
			lc.Store = limiter.NewRedisStore(rr.client)
			lc.Regions, lc.Region = len(sc.Regions), name
			lc.Deadline = r.cfg.StoreDeadline
			lc.UsageEpoch = r.t.epoch
			lc.Logger = r.log
			lc.EventSampleRate = -1
			lim, err := limiter.New(lc, pols)
			if err != nil {
				return fmt.Errorf("%w: limiter of region %s: %v", ErrRun, name, err)
			}
			sink := limiter.NewRedisUsageSink(rr.client, liveUsageShards, r.t.epoch, 0)
			fl := limiter.NewUsageFlusher(lim, sink, limiter.UsageFlusherConfig{Interval: r.t.flush, Logger: r.log})
			rr.gateways[set] = &gateway{lim: lim, flusher: fl}
		}
	}

	// Kafka: the topic exists before any coordinator looks for it.
	kc, err := kafkautil.New(kafkautil.DefaultConfig(r.cfg.KafkaBrokers...))
	if err != nil {
		return fmt.Errorf("%w: KafkaBrokers: %v", ErrConfig, err)
	}
	spec := kafkautil.RetainedTopic(r.cfg.Topic, 3, -1, time.Hour)
	spec.Config["max.message.bytes"] = strconv.Itoa(1_000_000 + 4096)
	tctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err = kc.EnsureTopics(tctx, spec)
	cancel()
	_ = kc.Close()
	if err != nil {
		return fmt.Errorf("%w: kafka at %v: %v", ErrRun, r.cfg.KafkaBrokers, err)
	}

	// Coordinators, last: a built coordinator holds a listener and clients
	// until its Run returns.
	if limits, _ := region.GlobalLimits(scaled, len(sc.Regions)); len(limits) == 0 {
		return nil
	}
	for _, rr := range r.regions {
		rc := region.DefaultConfig()
		rc.Region, rc.Regions = rr.name, sc.Regions
		rc.Epoch, rc.MaxWait, rc.CollectDelay = r.t.epoch, r.t.maxWait, r.t.collect
		rc.UsageShards = liveUsageShards
		rc.PressureInterval = r.t.flush // production: the gateways' flush, 1 s
		rc.RedisAddrs = []string{r.cfg.RedisAddrs[rr.name]}
		rc.KafkaBrokers, rc.Topic = r.cfg.KafkaBrokers, r.cfg.Topic
		rc.DailyQuotaTopic = kafkarepl.DefaultTopic + "." + r.cfg.RunID
		rc.Listen = "127.0.0.1:0"
		rc.Policies = scaled
		rc.Logger = r.log.With("region", rr.name)
		c, err := region.New(rc)
		if err != nil {
			return fmt.Errorf("%w: coordinator of region %s: %v", ErrRun, rr.name, err)
		}
		rr.coord = c
	}
	return nil
}

// dedupe drops repeated recorder indexes (a key named by several entries).
func dedupe(in []namedKey) []namedKey {
	seen := map[int]bool{}
	var out []namedKey
	for _, n := range in {
		if !seen[n.k] {
			seen[n.k] = true
			out = append(out, n)
		}
	}
	return out
}

// close releases what setup built and execute did not (a coordinator
// that never ran is run on a cancelled context, which closes it).
func (r *run) close() {
	for _, rr := range r.regions {
		if rr.coord != nil && !rr.ran {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_ = rr.coord.Run(ctx)
		}
		if rr.client != nil {
			_ = rr.client.Close()
		}
	}
}

// execute starts the coordinators and flushers, waits for t=0, replays
// the schedule in scaled real time, samples shares every scenario second,
// and stops everything.
func (r *run) execute(ctx context.Context) error {
	bg, stopBG := context.WithCancel(ctx) // coordinators and flushers
	defer stopBG()
	var bgWG sync.WaitGroup
	defer bgWG.Wait() // after stopBG (deferred later, runs first)
	for _, rr := range r.regions {
		if rr.coord != nil {
			rr.ran = true
			bgWG.Add(1)
			go func() {
				defer bgWG.Done()
				if err := rr.coord.Run(bg); err != nil {
					r.fail(fmt.Errorf("%w: coordinator of region %s: %v", ErrRun, rr.name, err))
				}
			}()
		}
		for _, gw := range rr.gateways {
			bgWG.Add(1)
			go func() {
				defer bgWG.Done()
				gw.flusher.Run(bg)
			}()
		}
	}

	epochNs := int64(r.t.epoch)
	now := time.Now().UnixNano()
	k := (now+int64(r.cfg.HeadStartEpochs)*epochNs)/epochNs + 1
	r.start = time.Unix(0, k*epochNs)
	if !simulations.SleepUntil(ctx, r.start) {
		return fmt.Errorf("%w: %v", ErrRun, ctx.Err())
	}

	var workWG sync.WaitGroup
	for ri, rr := range r.regions {
		for range r.cfg.Workers {
			workWG.Add(1)
			go func() {
				defer workWG.Done()
				r.worker(ctx, ri, rr)
			}()
		}
	}
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		r.sample(ctx)
	}()

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
	workWG.Wait()
	<-sampled
	r.status = map[string]rebalancer.Status{}
	r.cstats = map[string]CoordinatorStats{}
	for _, rr := range r.regions {
		if rr.coord != nil {
			r.status[rr.name] = rr.coord.Status()
			r.cstats[rr.name] = coordinatorStats(rr.coord.Registry())
		}
	}
	stopBG()
	bgWG.Wait()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %v", ErrRun, err)
	}
	return r.firstErr()
}

// worker decides the requests of one region's queue through the region's
// gateway limiters and records them.
func (r *run) worker(ctx context.Context, ri int, rr *regionRun) {
	scaleSecond := r.t.second
	for w := range rr.queue {
		late := time.Since(w.due)
		for {
			cur := r.maxLateNs.Load()
			if int64(late) <= cur || r.maxLateNs.CompareAndSwap(cur, int64(late)) {
				break
			}
		}
		if late > scaleSecond {
			r.late.Add(1)
		}
		e := &r.entries[w.req.Traffic]
		subj := e.subjects[w.req.Key]
		d, err := rr.gateways[e.policySet].lim.Check(ctx, limiter.Request{
			Identity: limiter.Identity{APIKey: subj, Account: subj, User: subj},
			Cost:     e.cost,
		})
		if err != nil {
			continue // only when ctx ended; execute reports it
		}
		r.requests.Add(1)
		switch d.Source {
		case limiter.SourceFallback:
			r.fallback.Add(1)
		case limiter.SourceDenyCache:
			r.denied.Add(1)
		}
		sec := w.req.AtNs / int64(time.Second)
		r.mu.Lock()
		for _, k := range e.tracked[w.req.Key] {
			r.rec.Record(k, ri, sec, e.cost, d.Allowed)
		}
		r.rec.Decision()
		r.mu.Unlock()
	}
}

// sample records, at the end of every scenario second, the share each
// region enforces for every named key (read from its Redis; absent means
// the default L/n), in scenario units, and reports progress.
func (r *run) sample(ctx context.Context) {
	n := int64(len(r.regions))
	total := r.sc.DurationSec
	vals := make([][]int64, len(r.regions))
	for s := range total {
		if !simulations.SleepUntil(ctx, r.start.Add(time.Duration(s+1)*r.t.second)) {
			return
		}
		for ri, rr := range r.regions {
			vals[ri] = r.readShares(ctx, rr, vals[ri][:0])
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

// readShares appends the share rate of every named key in rr's Redis, in
// scenario milli units per second, or -1 when there is no record (or it
// cannot be read).
func (r *run) readShares(ctx context.Context, rr *regionRun, out []int64) []int64 {
	if len(r.named) == 0 {
		return out
	}
	pipe := rr.client.Pipeline()
	cmds := make([]*redis.SliceCmd, len(r.named))
	for i, nk := range r.named {
		cmds[i] = pipe.HMGet(ctx, limiter.ShareKey(nk.subject, nk.policy.ID), "r")
	}
	_, _ = pipe.Exec(ctx)
	for _, c := range cmds {
		v := int64(-1)
		if res, err := c.Result(); err == nil && len(res) == 1 {
			if str, ok := res[0].(string); ok {
				if x, err := strconv.ParseInt(str, 10, 64); err == nil {
					v = x / r.t.scale
				}
			}
		}
		out = append(out, v)
	}
	return out
}

// liveUsageShards is the usage hashes per epoch of live runs' gateways and
// coordinators: scenarios have at most thousands of keys, and the default
// 16,384 (sized for 100,000 keys and more) costs a collection 64 round
// trips however few keys there are, too much in an epoch scaled down to
// half a second.
const liveUsageShards = 64
