package policysync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/region/admin"
)

// PolicySetter installs a policy set; *limiter.Limiter is one. An error
// means the old set stays in force.
type PolicySetter interface {
	SetPolicies([]*limiter.Policy) error
}

// ReloaderConfig configures a Reloader.
type ReloaderConfig struct {
	// Client is the region's Redis. Required.
	Client redis.UniversalClient
	// Target receives every new policy set. Required.
	Target PolicySetter
	// Interval is the longest time between two reads of the snapshot
	// (the bound when a notification is lost). Default 30 s.
	Interval time.Duration
	// Logger receives reload lines. Default: discard.
	Logger *slog.Logger
	// Metrics, when set, receives quotient_policy_generation,
	// quotient_policy_version{policy}, quotient_policy_reloads_total{result}
	// and quotient_policy_last_reload_timestamp_seconds.
	Metrics prometheus.Registerer
}

// Reloader is the gateway's policy cache: it keeps the last good snapshot
// of the region and installs its policies in the Target. Safe for
// concurrent use.
type Reloader struct {
	cfg ReloaderConfig

	loadMu    sync.Mutex // one Load at a time
	mu        sync.RWMutex
	gen       int64
	overrides map[string]overrideEntry // by admin.OverrideID

	genGauge  prometheus.Gauge
	versions  *prometheus.GaugeVec
	reloads   *prometheus.CounterVec
	lastGood  prometheus.Gauge
	published []string // policy ids with a version gauge; under loadMu
}

type overrideEntry struct {
	o      admin.Override
	policy *limiter.Policy // the overridden policy, validated
}

// ErrBadSnapshot is wrapped by Load when the stored snapshot does not parse.
var ErrBadSnapshot = errors.New("policysync: bad snapshot")

// NewReloader returns a Reloader; it fails on a missing field or when the
// metrics cannot be registered.
func NewReloader(cfg ReloaderConfig) (*Reloader, error) {
	if cfg.Client == nil || cfg.Target == nil {
		return nil, errors.New("policysync: reloader: Client and Target are required")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Reloader{
		cfg:      cfg,
		genGauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "quotient_policy_generation", Help: "Generation of the policy snapshot in force (sum of the highest versions of every policy and override)."}),
		versions: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "quotient_policy_version", Help: "Version in force of each policy."}, []string{"policy"}),
		reloads:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quotient_policy_reloads_total", Help: "Reads of the policy snapshot by result (changed, unchanged, error, invalid)."}, []string{"result"}),
		lastGood: prometheus.NewGauge(prometheus.GaugeOpts{Name: "quotient_policy_last_reload_timestamp_seconds", Help: "Unix time of the last successful read of the policy snapshot."}),
	}
	if cfg.Metrics != nil {
		for _, c := range []prometheus.Collector{r.genGauge, r.versions, r.reloads, r.lastGood} {
			if err := cfg.Metrics.Register(c); err != nil {
				return nil, fmt.Errorf("policysync: reloader metrics: %w", err)
			}
		}
	}
	return r, nil
}

// Generation is the generation in force (0 before the first load).
func (r *Reloader) Generation() int64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.gen
}

// Override returns the policy p as overridden for subject at now, and
// false when no override of p for subject is in force.
func (r *Reloader) Override(subject limiter.Subject, policyID string, now time.Time) (*limiter.Policy, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.overrides[admin.OverrideID(policyID, subject.Key())]
	if !ok || !e.o.Active(now) {
		return nil, false
	}
	return e.policy, true
}

// Load reads the snapshot once and installs it if it is newer than the one
// in force. On any error the set in force stays.
func (r *Reloader) Load(ctx context.Context) error {
	r.loadMu.Lock()
	defer r.loadMu.Unlock()
	err := r.load(ctx)
	switch {
	case errors.Is(err, ErrBadSnapshot):
		r.reloads.WithLabelValues("invalid").Inc()
	case err != nil:
		r.reloads.WithLabelValues("error").Inc()
	}
	if err != nil {
		r.cfg.Logger.Warn("policysync: keeping the policies in force", "generation", r.Generation(), "err", err)
	}
	return err
}

func (r *Reloader) load(ctx context.Context) error {
	doc, err := r.cfg.Client.HGet(ctx, SnapshotKey, "doc").Bytes()
	if errors.Is(err, redis.Nil) {
		r.reloads.WithLabelValues("unchanged").Inc()
		return nil // nothing published yet: keep what we have
	}
	if err != nil {
		return fmt.Errorf("policysync: read snapshot: %w", err)
	}
	r.lastGood.SetToCurrentTime()
	var s struct {
		Generation int64             `json:"generation"`
		Policies   json.RawMessage   `json:"policies"`
		Overrides  []json.RawMessage `json:"overrides"`
	}
	if err := json.Unmarshal(doc, &s); err != nil {
		return fmt.Errorf("%w: %v", ErrBadSnapshot, err)
	}
	if s.Generation <= r.Generation() {
		r.reloads.WithLabelValues("unchanged").Inc()
		return nil
	}
	pols, err := limiter.ParsePolicies(s.Policies)
	if err != nil {
		return fmt.Errorf("%w: generation %d: %v", ErrBadSnapshot, s.Generation, err)
	}
	byID := map[string]*limiter.Policy{}
	for _, p := range pols {
		byID[p.ID] = p
	}
	ovs := map[string]overrideEntry{}
	for _, raw := range s.Overrides {
		var o admin.Override
		if err := json.Unmarshal(raw, &o); err != nil {
			return fmt.Errorf("%w: generation %d: override: %v", ErrBadSnapshot, s.Generation, err)
		}
		base, ok := byID[o.Policy]
		if !ok {
			continue // its policy was deleted: the override lapses
		}
		p, err := o.Apply(base)
		if err != nil {
			r.cfg.Logger.Warn("policysync: override does not fit its policy; ignored", "override", o.ID, "err", err)
			continue
		}
		ovs[o.ID] = overrideEntry{o: o, policy: p}
	}
	if err := r.cfg.Target.SetPolicies(pols); err != nil {
		return fmt.Errorf("%w: generation %d: %v", ErrBadSnapshot, s.Generation, err)
	}
	r.mu.Lock()
	r.gen, r.overrides = s.Generation, ovs
	r.mu.Unlock()
	old := r.published
	r.published = nil
	for _, id := range old {
		r.versions.DeleteLabelValues(id)
	}
	for _, p := range pols {
		r.versions.WithLabelValues(p.ID).Set(float64(p.Version))
		r.published = append(r.published, p.ID)
	}
	r.genGauge.Set(float64(s.Generation))
	r.reloads.WithLabelValues("changed").Inc()
	r.cfg.Logger.Info("policysync: policies reloaded", "generation", s.Generation, "policies", len(pols), "overrides", len(ovs))
	return nil
}

// Run loads at once, then on every notification and at least every
// Interval, until ctx ends; it returns ctx.Err(). Errors are logged and
// counted, never fatal: the last good set stays in force.
func (r *Reloader) Run(ctx context.Context) error {
	sub := r.cfg.Client.Subscribe(ctx, SnapshotChannel)
	defer func() { _ = sub.Close() }()
	msgs := sub.Channel()
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		_ = r.Load(ctx)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-msgs:
		case <-t.C:
		}
	}
}

// VersionGauge is the version gauge of one policy (for tests and status
// pages).
func (r *Reloader) VersionGauge(policy string) prometheus.Gauge {
	return r.versions.WithLabelValues(policy)
}

// ReloadCounter is the reload counter of one result.
func (r *Reloader) ReloadCounter(result string) prometheus.Counter {
	return r.reloads.WithLabelValues(result)
}
