package redisio

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
)

// ErrPressure is wrapped by PressureSource's errors when Redis could not be
// read.
var ErrPressure = errors.New("redisio: pressure read failed")

// PressureSource reads the gateways' pressure marks and current usage
// from the region's Redis (limiter.UsagePressureKey, limiter.UsageKey) as
// a rebalancer.PressureSource, and waits for the gateways' wake token
// (limiter.UsagePressureWakeKey) as a rebalancer.PressureWaker. It
// remembers the counts of its last read (two epochs' pressure hashes, at
// most maxKeys fields each), so its demand rates are what each key's
// marks gained since then, over at least the window (the gateways' flush
// interval: see SetWindow). Safe for concurrent use (calls are
// serialised).
type PressureSource struct {
	client  redis.UniversalClient
	shards  int
	epoch   time.Duration
	maxKeys int

	window time.Duration // the shortest span a demand rate is measured over

	mu sync.Mutex
	// last holds the counts of the last read (nil before the first read
	// and after a failed one).
	last *pressureSnap
	more int64 // reads that found more than maxKeys fields
	// own holds, per key field, the usage counts of Demand's last read
	// of it (a baseline for the next one) and the rate it gave.
	own map[string]ownRead
}

// pressureSnap is the pressure hashes' counts at one read.
type pressureSnap struct {
	at     time.Time
	counts map[int64]map[string]int64 // epoch -> field -> count
}

// ownRead is one key's usage counts (by epoch) at a Demand read, and the
// rate computed then (rateOK false when it was an estimate).
type ownRead struct {
	at     time.Time
	counts map[int64]int64
	rate   int64
	rateOK bool
}

var (
	_ rebalancer.PressureSource = (*PressureSource)(nil)
	_ rebalancer.PressureWaker  = (*PressureSource)(nil)
)

// NewPressureSource returns a PressureSource on client (owned by the
// caller) for gateways with shards usage shards
// (limiter.DefaultUsageShards when <= 0) and epochs of epoch, reading at
// most maxKeys pressure fields per epoch hash
// (limiter.DefaultPressureMaxKeys when <= 0).
func NewPressureSource(client redis.UniversalClient, shards int, epoch time.Duration, maxKeys int) *PressureSource {
	if shards <= 0 {
		shards = limiter.DefaultUsageShards
	}
	if maxKeys <= 0 {
		maxKeys = limiter.DefaultPressureMaxKeys
	}
	return &PressureSource{client: client, shards: shards, epoch: epoch, maxKeys: maxKeys, window: DefaultPressureWindow}
}

// DefaultPressureWindow is the default shortest span of a demand rate: the
// gateways' default usage flush interval (1 s).
const DefaultPressureWindow = time.Second

// SetWindow sets the shortest span a demand rate is measured over
// (DefaultPressureWindow when w <= 0): the gateways' usage flush
// interval, so that a read soon after another (woken by a flush) does not
// overestimate a rate (a span shorter than a flush interval holds up to a
// whole interval's flush). Call it before the first read.
func (p *PressureSource) SetWindow(w time.Duration) {
	if w <= 0 {
		w = DefaultPressureWindow
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.window = w
}

// Truncated returns how many reads found a pressure hash with more fields
// than the bound (the rest was not read).
func (p *PressureSource) Truncated() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.more
}

// Pressure implements rebalancer.PressureSource: it reads the pressure
// hashes of now's epoch and the one before (a gateway's flush of the last
// second of an epoch lands after it ends), and returns every key whose
// count grew since the last read, with demand rate = growth / max(time
// since that read, the window). A read woken soon after another (a flush
// with new pressure, or whose pressured key's traffic left: see
// limiter.UsagePressureWakeKey) therefore never measures a rate over less
// than a flush interval (a shorter span may hold a whole interval's
// flush); it lists only the keys flushed since the last read, so until
// the next read (an interval later) a key another gateway rejects may
// read as unpressured: ReceiveAsk still keeps its own demand times the
// headroom. A field absent at the last read of its epoch counted 0 then;
// an epoch that started after the last read counted 0 at it. The first
// call, and the first one after a read failed, only remembers the counts.
// Fields that do not parse are skipped (limiter.CollectUsagePressure).
func (p *PressureSource) Pressure(ctx context.Context, now time.Time) ([]rebalancer.Pressure, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := rebalancer.EpochOf(now, p.epoch)
	cur := make(map[int64]map[string]int64, 2)
	for _, ep := range []int64{e - 1, e} {
		marks, more, err := limiter.CollectUsagePressure(ctx, p.client, ep, p.maxKeys)
		if err != nil && !errors.Is(err, limiter.ErrBadUsage) {
			p.last = nil
			return nil, fmt.Errorf("%w: %w", ErrPressure, err)
		}
		if more {
			p.more++
		}
		m := make(map[string]int64, len(marks))
		for _, mk := range marks {
			m[mk.PolicyID+":"+mk.SubjectKey] = mk.Demand
		}
		cur[ep] = m
	}
	base := p.last
	p.last = &pressureSnap{at: now, counts: cur}
	if base == nil || !now.After(base.at) {
		return nil, nil
	}
	grown := map[string]int64{}
	for ep, m := range cur {
		before, known := base.counts[ep]
		if !known && rebalancer.EpochStart(ep, p.epoch).Before(base.at) {
			continue // the epoch ran at the base read, which did not read it
		}
		for f, n := range m {
			if d := n - before[f]; d > 0 {
				grown[f] += d
			}
		}
	}
	elapsed := max(now.Sub(base.at), p.window).Milliseconds()
	out := make([]rebalancer.Pressure, 0, len(grown))
	for f, d := range grown {
		k, ok := splitField(f)
		if !ok {
			continue
		}
		out = append(out, rebalancer.Pressure{Key: k, DemandMilli: d * 1000 * 1000 / max(1, elapsed)})
	}
	return out, nil
}

// WaitPressure implements rebalancer.PressureWaker: it pops the gateways'
// wake token (BLPOP limiter.UsagePressureWakeKey, on one of the client's
// connections, which it holds meanwhile; Redis serves every other client)
// and reports whether there was one within wait (rounded up to whole
// seconds, at least one: BLPOP's resolution in the client). ctx bounds the call too when the client
// honours contexts; else it returns within wait plus the client's read
// timeout. An unreachable Redis is an error wrapping ErrPressure.
func (p *PressureSource) WaitPressure(ctx context.Context, wait time.Duration) (bool, error) {
	wait = max(time.Second, (wait+time.Second-1)/time.Second*time.Second)
	_, err := p.client.BLPop(ctx, wait, limiter.UsagePressureWakeKey).Result()
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, redis.Nil):
		return false, nil
	case ctx.Err() != nil:
		return false, ctx.Err()
	}
	return false, fmt.Errorf("%w: wait for the wake token: %w", ErrPressure, err)
}

// Demand implements rebalancer.PressureSource: each key's recent demand
// rate. A key read before, between min(epoch/10, the window) and epoch/2
// ago (1 s and 5 s with 10 s epochs and the default window: one gateway
// flush at least, so the counts moved; see SetWindow), gets what its usage
// counts gained since that read over the time since; read sooner, the rate
// of that read again. (The window bounds it since a 250 ms flush interval
// with 4 s epochs left an asker's third ask, half an ask interval after
// its second, reading the epoch-to-date estimate of a giver whose traffic
// had just left: nothing was given until the next decision.) Otherwise
// (a first ask for the key, or an old baseline) the estimate is its demand
// so far in now's epoch over the time the epoch has run (a slight
// underestimate: the gateways' last flush interval is not in Redis yet);
// in the first second of an epoch (DemandMinWindow) the previous epoch's
// demand is added, over its length too, so that an epoch's first flushes
// do not read as idle (which would give away share still in use). That estimate
// is high for a key whose traffic just left (the epoch's earlier part
// counts), so such a giver gives at the asker's next ask, when the
// counts since this read show the traffic gone. Keys without usage are
// missing.
func (p *PressureSource) Demand(ctx context.Context, now time.Time, keys []rebalancer.Key) ([]rebalancer.Pressure, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	fields := make([]string, len(keys))
	for i, k := range keys {
		fields[i] = k.PolicyID + ":" + k.Subject
	}
	e := rebalancer.EpochOf(now, p.epoch)
	counts := map[int64][]int64{}
	for _, ep := range []int64{e - 1, e} {
		d, err := limiter.CollectUsageDemand(ctx, p.client, ep, p.shards, fields)
		if err != nil && !errors.Is(err, limiter.ErrBadUsage) {
			return nil, fmt.Errorf("%w: %w", ErrPressure, err)
		}
		counts[ep] = d
	}
	elapsed := now.Sub(rebalancer.EpochStart(e, p.epoch))
	estimate := func(i int) int64 {
		total, window := counts[e][i], elapsed
		if elapsed < DemandMinWindow && elapsed < p.epoch {
			total += counts[e-1][i]
			window += p.epoch
		}
		return total * 1000 * 1000 / max(1, window.Milliseconds())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	minAge, maxAge := min(p.epoch/10, p.window), p.epoch/2
	if p.own == nil {
		p.own = map[string]ownRead{}
	}
	for f, r := range p.own {
		if now.Sub(r.at) > maxAge || now.Before(r.at) {
			delete(p.own, f)
		}
	}
	out := make([]rebalancer.Pressure, 0, len(keys))
	for i, k := range keys {
		cur := map[int64]int64{e - 1: counts[e-1][i], e: counts[e][i]}
		prev, known := p.own[fields[i]]
		age := now.Sub(prev.at)
		var rate int64
		switch {
		case known && age < minAge:
			rate = estimate(i)
			if prev.rateOK {
				rate = prev.rate
			}
		case known:
			delta, ok := int64(0), true
			for ep, n := range cur {
				before, had := prev.counts[ep]
				if !had && rebalancer.EpochStart(ep, p.epoch).Before(prev.at) {
					ok = false // the epoch ran at that read, which did not read it
					break
				}
				delta += max(0, n-before)
			}
			if ok {
				rate = delta * 1000 * 1000 / max(1, age.Milliseconds())
			} else {
				rate = estimate(i)
			}
			p.own[fields[i]] = ownRead{at: now, counts: cur, rate: rate, rateOK: ok}
		default:
			rate = estimate(i)
			p.own[fields[i]] = ownRead{at: now, counts: cur, rate: rate}
		}
		if rate > 0 {
			out = append(out, rebalancer.Pressure{Key: k, DemandMilli: rate})
		}
	}
	return out, nil
}

// DemandMinWindow is the shortest part of the current epoch that
// PressureSource.Demand reads alone; before it, the previous epoch counts
// too. One second: the gateways' default usage flush interval.
const DemandMinWindow = time.Second

// splitField splits "<policy id>:<subject key>" (policy ids hold no ':').
func splitField(f string) (rebalancer.Key, bool) {
	for i := 0; i < len(f); i++ {
		if f[i] == ':' {
			return rebalancer.Key{PolicyID: f[:i], Subject: f[i+1:]}, i > 0
		}
	}
	return rebalancer.Key{}, false
}
