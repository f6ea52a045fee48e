package limiter

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric names, all registered on Config.Metrics (never a global
// registry). Labels are bounded by the policy set: never a subject, key or
// path.
//
//	quotient_limiter_decisions_total{policy,decision,source}   counter; decision is
//	    allowed, rejected or shadow_rejected; source store, deny_cache or fallback
//	quotient_limiter_check_duration_seconds{source}             histogram of Check latency
//	quotient_limiter_store_errors_total                         counter: failed or timed-out store calls
//	quotient_limiter_breaker_state                              gauge: 0 closed, 1 half-open, 2 open
//	quotient_limiter_fallback_decisions_total{policy,decision}  counter: answers of the fallback
//	quotient_limiter_deny_cache_hits_total{policy}              counter: requests rejected by the deny cache
//	quotient_limiter_usage_flush_errors_total                   counter: usage flushes that failed (retried)
//	quotient_limiter_usage_dropped_total                        counter: usage counts dropped (bound or lag)
//	quotient_limiter_usage_overflow_keys_total                  counter: keys whose usage was dropped at UsageMaxKeys (per epoch)
//	quotient_limiter_usage_overflow_requests_total              counter: attempts whose usage was dropped at UsageMaxKeys
//	quotient_limiter_refund_failures_total                      counter (RedisStore): refunds that failed
//	quotient_limiter_pipeline_shed_total                        counter (pipelined RedisStore): calls shed, queue full
type metrics struct {
	decisions   *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	storeErrors prometheus.Counter
	breaker     prometheus.Gauge
	fallback    *prometheus.CounterVec
	denyHits    *prometheus.CounterVec
	flushErrors prometheus.Counter
	dropped     prometheus.Counter
	ovfKeys     prometheus.Counter
	ovfRequests prometheus.Counter

	latStore, latDeny, latFallback, latNone prometheus.Observer

	mu    sync.RWMutex
	cache map[metricKey]prometheus.Counter
}

type metricKey struct {
	kind     uint8 // 0 decision, 1 fallback, 2 deny hit
	policy   string
	decision string
	source   Source
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotient_limiter_decisions_total",
			Help: "Policy decisions by policy, decision (allowed, rejected, shadow_rejected) and source (store, deny_cache, fallback).",
		}, []string{"policy", "decision", "source"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "quotient_limiter_check_duration_seconds",
			Help:    "Latency of Check in seconds, by the source that answered.",
			Buckets: []float64{25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 25e-3, 100e-3},
		}, []string{"source"}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quotient_limiter_store_errors_total",
			Help: "Store calls that failed or missed their deadline.",
		}),
		breaker: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "quotient_limiter_breaker_state",
			Help: "Circuit breaker state: 0 closed, 1 half-open, 2 open.",
		}),
		fallback: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotient_limiter_fallback_decisions_total",
			Help: "Policy decisions answered by the in-process fallback while the store could not answer.",
		}, []string{"policy", "decision"}),
		denyHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotient_limiter_deny_cache_hits_total",
			Help: "Requests rejected by the local deny cache without a store call.",
		}, []string{"policy"}),
		flushErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quotient_limiter_usage_flush_errors_total",
			Help: "Usage flushes that failed; their counts are retried on the next flush.",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quotient_limiter_usage_dropped_total",
			Help: "Usage counts dropped because of the memory bound or because their epoch was too old to retry.",
		}),
		ovfKeys: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quotient_limiter_usage_overflow_keys_total",
			Help: "Keys (policy and subject) whose usage of an epoch was dropped because UsageMaxKeys counts were held; each key counts once per epoch. The coordinator holds those epochs' shares instead of shrinking them.",
		}),
		ovfRequests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quotient_limiter_usage_overflow_requests_total",
			Help: "Attempts (one per global policy counted) whose usage was dropped because UsageMaxKeys counts were held.",
		}),
		cache: make(map[metricKey]prometheus.Counter),
	}
	for _, c := range []prometheus.Collector{m.decisions, m.latency, m.storeErrors, m.breaker, m.fallback, m.denyHits, m.flushErrors, m.dropped, m.ovfKeys, m.ovfRequests} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	m.latStore = m.latency.WithLabelValues(string(SourceStore))
	m.latDeny = m.latency.WithLabelValues(string(SourceDenyCache))
	m.latFallback = m.latency.WithLabelValues(string(SourceFallback))
	m.latNone = m.latency.WithLabelValues(string(SourceNone))
	return m, nil
}

// counter returns the cached child counter of k; lookups allocate nothing.
func (m *metrics) counter(k metricKey) prometheus.Counter {
	m.mu.RLock()
	c := m.cache[k]
	m.mu.RUnlock()
	if c != nil {
		return c
	}
	switch k.kind {
	case 0:
		c = m.decisions.WithLabelValues(k.policy, k.decision, string(k.source))
	case 1:
		c = m.fallback.WithLabelValues(k.policy, k.decision)
	default:
		c = m.denyHits.WithLabelValues(k.policy)
	}
	m.mu.Lock()
	m.cache[k] = c
	m.mu.Unlock()
	return c
}

// forget drops the cached children (the policy set changed); the series
// of removed policies stay until the process restarts, as counters should.
func (m *metrics) forget() {
	if m == nil {
		return
	}
	m.mu.Lock()
	clear(m.cache)
	m.mu.Unlock()
}

func decisionLabel(pd *PolicyDecision) string {
	switch {
	case pd.Allowed:
		return "allowed"
	case pd.Policy.Mode == Shadow:
		return "shadow_rejected"
	}
	return "rejected"
}

func (m *metrics) observe(d *Decision, elapsed time.Duration) {
	if m == nil {
		return
	}
	for i := range d.Policies {
		pd := &d.Policies[i]
		dl := decisionLabel(pd)
		m.counter(metricKey{kind: 0, policy: pd.Policy.ID, decision: dl, source: pd.Source}).Inc()
		switch pd.Source {
		case SourceFallback:
			m.counter(metricKey{kind: 1, policy: pd.Policy.ID, decision: dl}).Inc()
		case SourceDenyCache:
			m.counter(metricKey{kind: 2, policy: pd.Policy.ID}).Inc()
		}
	}
	var o prometheus.Observer
	switch d.Source {
	case SourceStore:
		o = m.latStore
	case SourceDenyCache:
		o = m.latDeny
	case SourceFallback:
		o = m.latFallback
	default:
		o = m.latNone
	}
	o.Observe(elapsed.Seconds())
}

func (m *metrics) storeError() {
	if m != nil {
		m.storeErrors.Inc()
	}
}

func (m *metrics) breakerState(s BreakerState) {
	if m != nil {
		m.breaker.Set(float64(s))
	}
}

func (m *metrics) usageFlushError() {
	if m != nil {
		m.flushErrors.Inc()
	}
}

func (m *metrics) usageDropped(n int) {
	if m != nil {
		m.dropped.Add(float64(n))
	}
}

// usageOverflow counts usage dropped at the UsageMaxKeys bound: keys new
// to the epoch's overflow, and attempts.
func (m *metrics) usageOverflow(keys, requests int) {
	if m != nil {
		m.dropped.Add(float64(requests))
		m.ovfKeys.Add(float64(keys))
		m.ovfRequests.Add(float64(requests))
	}
}
