package dailyquota_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/dailyquota"
	"github.com/quotientlabs/quotient/internal/rawcheck"
	"github.com/quotientlabs/quotient/limiter"
)

// A virtual-time harness: regions with the production limiter over a
// limiter.MemoryStore and the production Driver (Pass and Deliver called
// by the harness, no goroutines), connected by an in-memory bus with a
// fixed latency that can cut a region off. Time is a value the test moves.

var errNoRun = errors.New("harness: the harness delivers, Run is not used")

// memStore is dailyquota.Store over a limiter.MemoryStore at the harness
// clock.
type memStore struct {
	ms  *limiter.MemoryStore
	now *time.Time
}

func subjectOf(key string) limiter.Subject {
	s, err := limiter.ParseSubjectKey(key)
	if err != nil {
		panic(err)
	}
	return s
}

func (m *memStore) Read(_ context.Context, keys []dailyquota.PolicySubject) ([]dailyquota.Stored, error) {
	out := make([]dailyquota.Stored, len(keys))
	for i, k := range keys {
		wc := m.ms.WindowCounts(*m.now, subjectOf(k.Subject), k.Policy)
		out[i] = dailyquota.Stored{StartMs: wc.StartMs, Counts: wc.Counts, Cap: wc.Cap}
	}
	return out, nil
}

func (m *memStore) Merge(_ context.Context, counts []dailyquota.Count) ([]dailyquota.Count, error) {
	for _, c := range counts {
		m.ms.MergeWindowCount(*m.now, subjectOf(c.Subject), c.Policy, c.StartMs, c.WindowMs, c.Region, c.N)
	}
	return nil, nil
}

func (m *memStore) SetCaps(_ context.Context, caps []dailyquota.CapUpdate) ([]dailyquota.CapUpdate, error) {
	for _, c := range caps {
		m.ms.SetWindowCap(*m.now, subjectOf(c.Subject), c.Policy, c.StartMs, c.WindowMs, c.Cap)
	}
	return nil, nil
}

type fixedActive []dailyquota.PolicySubject

func (f fixedActive) Active(context.Context, time.Time) ([]dailyquota.PolicySubject, error) {
	return f, nil
}

type inFlight struct {
	at time.Time
	to int
	c  dailyquota.Count
}

// memBus publishes to the harness's queue.
type memBus struct {
	h    *harness
	from int
}

func (b *memBus) Publish(_ context.Context, counts []dailyquota.Count) error {
	h := b.h
	if h.cut[b.from] {
		return errors.New("harness: region cut off")
	}
	for to := range h.regions {
		if to != b.from {
			for _, c := range counts {
				h.queue = append(h.queue, inFlight{at: h.now.Add(h.latency), to: to, c: c})
			}
		}
	}
	return nil
}

func (b *memBus) Run(context.Context, func(dailyquota.Count)) error { return errNoRun }

type clock struct{ now *time.Time }

func (c clock) Now() time.Time { return *c.now }
func (c clock) NewTimer(time.Duration) (<-chan time.Time, func() bool) {
	panic("harness: timers are not used")
}

type hRegion struct {
	name   string
	store  *limiter.MemoryStore
	lim    *limiter.Limiter
	driver *dailyquota.Driver
}

type harness struct {
	t       *testing.T
	now     time.Time
	latency time.Duration
	regions []*hRegion
	cut     []bool
	queue   []inFlight
	pol     *limiter.Policy
}

func newHarness(t *testing.T, start time.Time, names []string, policy string, latency time.Duration, split bool) *harness {
	pol, err := limiter.ParsePolicy([]byte(policy))
	require.NoError(t, err)
	h := &harness{t: t, now: start, latency: latency, pol: pol, cut: make([]bool, len(names))}
	spec := dailyquota.Fixed(time.Duration(pol.WindowSec) * time.Second)
	if pol.Monthly() {
		spec = dailyquota.Month()
	}
	pols := []dailyquota.Policy{{ID: pol.ID, Limit: pol.Limit, Window: spec}}
	for i, n := range names {
		ms := limiter.NewMemoryStore()
		lim, err := limiter.New(limiter.Config{Store: ms, Region: n, Regions: len(names)}, []*limiter.Policy{pol})
		require.NoError(t, err)
		cfg := dailyquota.DefaultDriverConfig(n, names, pols)
		cfg.Clock = clock{&h.now}
		cfg.NoSplit = !split
		drv, err := dailyquota.NewDriver(cfg, &memStore{ms, &h.now}, fixedActive{{Policy: pol.ID, Subject: testSubject.Key()}}, &memBus{h, i})
		require.NoError(t, err)
		h.regions = append(h.regions, &hRegion{name: n, store: ms, lim: lim, driver: drv})
	}
	return h
}

var testSubject = limiter.Subject{Kind: limiter.SubjectAccount, Value: "acme"}

// admit asks region i for cost at the harness time.
func (h *harness) admit(i int, cost int64) bool {
	d, err := rawcheck.CheckSubjectAt(h.regions[i].lim, context.Background(), h.now, testSubject, []*limiter.Policy{h.pol}, cost)
	require.NoError(h.t, err)
	return d.Allowed
}

// deliver hands over every message due by now, except to cut-off regions
// (those are dropped, like a partition that outlasts retention; the
// refresh republishes them later).
func (h *harness) deliver() {
	sort.SliceStable(h.queue, func(i, j int) bool { return h.queue[i].at.Before(h.queue[j].at) })
	k := 0
	for k < len(h.queue) && !h.queue[k].at.After(h.now) {
		m := h.queue[k]
		if !h.cut[m.to] {
			h.regions[m.to].driver.Deliver(m.c)
		}
		k++
	}
	h.queue = h.queue[k:]
}

func (h *harness) pass() {
	for i, r := range h.regions {
		err := r.driver.Pass(context.Background())
		if !h.cut[i] {
			require.NoError(h.t, err)
		}
	}
}

func (h *harness) counts(i int) map[string]int64 {
	return h.regions[i].store.WindowCounts(h.now, testSubject, h.pol.ID).Counts
}

func (h *harness) String() string {
	s := ""
	for i, r := range h.regions {
		s += fmt.Sprintf("%s=%v ", r.name, h.counts(i))
	}
	return s
}

func countOf(region string, start time.Time, n int64) dailyquota.Count {
	return dailyquota.Count{Key: dailyquota.Key{Subject: testSubject.Key(), Policy: "day", StartMs: start.UnixMilli(), Region: region}, WindowMs: 86_400_000, N: n, UpdatedMs: start.UnixMilli()}
}
