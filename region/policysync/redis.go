package policysync

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotientlabs/quotient/region/admin"
)

// Redis names of the snapshot: a hash with fields gen and doc, and the
// channel its generation is published on when it changes. One key, so it
// works on a Redis Cluster too (PUBLISH reaches every node's subscribers).
const (
	SnapshotKey     = "quotient:policyset"
	SnapshotChannel = "quotient:policyset"
)

// Snapshot is what gateways read: every policy in force and every override
// not deleted (expired ones included; the gateway judges expiry by its
// clock), at one Catalog generation.
type Snapshot struct {
	Generation int64             `json:"generation"`
	Policies   []json.RawMessage `json:"policies"`
	Overrides  []admin.Override  `json:"overrides"`
}

// SnapshotOf takes the snapshot of cat.
func SnapshotOf(cat *admin.Catalog) Snapshot {
	s := Snapshot{Generation: cat.Generation(), Policies: []json.RawMessage{}, Overrides: []admin.Override{}}
	for _, e := range cat.Policies() {
		s.Policies = append(s.Policies, json.RawMessage(e.Document))
	}
	for _, e := range cat.AllOverrides() {
		s.Overrides = append(s.Overrides, *e.Override)
	}
	return s
}

// writeScript stores the snapshot unless the stored one is newer, and
// publishes its generation when the stored document changed.
var writeScript = redis.NewScript(`
local g = redis.call('HGET', KEYS[1], 'gen')
if g and tonumber(g) > tonumber(ARGV[1]) then return 0 end
if g and tonumber(g) == tonumber(ARGV[1]) and redis.call('HGET', KEYS[1], 'doc') == ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'gen', ARGV[1], 'doc', ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[1])
return 1
`)

// WriteSnapshot stores s in the region's Redis and notifies the gateways.
// It reports whether the stored snapshot changed (false when the stored
// one is as new or newer).
func WriteSnapshot(ctx context.Context, c redis.UniversalClient, s Snapshot) (bool, error) {
	doc, err := json.Marshal(s)
	if err != nil {
		return false, fmt.Errorf("policysync: snapshot: %w", err)
	}
	n, err := writeScript.Run(ctx, c, []string{SnapshotKey}, s.Generation, doc, SnapshotChannel).Int()
	if err != nil {
		return false, fmt.Errorf("policysync: write snapshot: %w", err)
	}
	return n == 1, nil
}

// Materializer keeps the region's snapshot in step with a Catalog: call
// Notify after a change; Run writes the newest snapshot, retrying every
// RetryInterval while Redis fails. Safe for concurrent use.
type Materializer struct {
	cat    *admin.Catalog
	client redis.UniversalClient
	logger *slog.Logger
	kick   chan struct{}
	// RetryInterval is the wait after a failed write (default 1 s); it
	// is also how often the snapshot is rewritten without a change, which
	// repairs a Redis that lost it.
	RetryInterval time.Duration
}

// NewMaterializer returns a Materializer of cat into client.
func NewMaterializer(cat *admin.Catalog, client redis.UniversalClient, logger *slog.Logger) *Materializer {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Materializer{cat: cat, client: client, logger: logger, kick: make(chan struct{}, 1), RetryInterval: time.Second}
}

// Notify asks for a write; it never blocks.
func (m *Materializer) Notify() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// Run writes snapshots until ctx ends; it returns ctx.Err().
func (m *Materializer) Run(ctx context.Context) error {
	t := time.NewTicker(m.RetryInterval)
	defer t.Stop()
	for {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		s := SnapshotOf(m.cat)
		changed, err := WriteSnapshot(wctx, m.client, s)
		cancel()
		if err != nil && ctx.Err() == nil {
			m.logger.Warn("policysync: snapshot not written; retrying", "generation", s.Generation, "err", err)
		} else if changed {
			m.logger.Info("policysync: snapshot written", "generation", s.Generation, "policies", len(s.Policies), "overrides", len(s.Overrides))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.kick:
		case <-t.C:
		}
	}
}
