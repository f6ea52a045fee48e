package kafkarepl

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/proto"

	"github.com/quotientlabs/quotient/dailyquota"
	"github.com/quotientlabs/quotient/internal/kafkautil"
	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
)

// DefaultTopic is the daily-quota topic (shared layout), and the local topic
// each region publishes to in the mirrored layout.
const DefaultTopic = "quotient.daily-quota"

// Errors callers branch on.
var (
	// ErrConfig wraps every configuration error.
	ErrConfig = errors.New("kafkarepl: invalid config")
	// ErrClosed is returned by Publish after Close.
	ErrClosed = errors.New("kafkarepl: closed")
)

// MirroredTopics returns the topics a region consumes in the MirrorMaker 2
// layout: its local topic and "<region>.<topic>" for each remote region.
func MirroredTopics(topic string, remoteRegions ...string) []string {
	return kafkautil.MirroredTopics(topic, remoteRegions...)
}

// Config configures a Bus. Start from DefaultConfig.
type Config struct {
	// Topic Publish writes to. Default DefaultTopic.
	Topic string
	// ConsumeTopics are read by Run, every partition of each. Default
	// []string{Topic}.
	ConsumeTopics []string
	// SkipCreateTopic: do not create Topic on first Publish.
	SkipCreateTopic bool
	// Partitions of a created topic. Default 12.
	Partitions int
	// ReplicationFactor of a created topic. Default -1 (broker default).
	ReplicationFactor int
	// Retention of a created topic (cleanup.policy=compact,delete).
	// Default 72 h.
	Retention time.Duration
	// TopicPollInterval: how often Run looks again for a missing topic or
	// added partitions. Default 5 s.
	TopicPollInterval time.Duration
	// Now is the clock for record timestamps; nil means time.Now.
	Now func() time.Time
}

// DefaultConfig returns the defaults of the shared layout.
func DefaultConfig() Config {
	return Config{
		Topic: DefaultTopic, Partitions: 12, ReplicationFactor: -1,
		Retention: 72 * time.Hour, TopicPollInterval: 5 * time.Second,
	}
}

// Validate fills defaults and rejects bad values, naming the field.
func (c *Config) Validate() error {
	d := DefaultConfig()
	shared := c.busConfig()
	if err := shared.Fill(d.busConfig(), ErrConfig); err != nil {
		return err
	}
	c.Topic, c.ConsumeTopics, c.Partitions, c.ReplicationFactor = shared.Topic, shared.ConsumeTopics, shared.Partitions, shared.ReplicationFactor
	c.Retention, c.TopicPollInterval, c.Now = shared.Retention, shared.TopicPollInterval, shared.Now
	return nil
}

// busConfig is the part of c every bus shares, which kafkautil checks.
func (c *Config) busConfig() kafkautil.BusConfig {
	return kafkautil.BusConfig{
		Topic: c.Topic, ConsumeTopics: c.ConsumeTopics, Partitions: c.Partitions, ReplicationFactor: c.ReplicationFactor,
		Retention: c.Retention, TopicPollInterval: c.TopicPollInterval, Now: c.Now,
	}
}

// Stats counts what a Bus did since New.
type Stats struct {
	Published int64 // records acknowledged
	Consumed  int64 // records read
	Malformed int64 // records that did not decode, skipped
	Restarts  int64 // partitions restarted at their first offset (offset out of range)
}

// Bus publishes this region's counts and consumes every region's. Publish
// and Run are safe for concurrent use. Construct with New.
type Bus struct {
	cfg      Config
	cluster  *kafkautil.Cluster
	producer *kafkautil.Producer

	published, consumed, malformed, restarts atomic.Int64
}

var _ dailyquota.Bus = (*Bus)(nil)

// New returns a Bus on cluster (owned by the caller, closed after the Bus).
// It does no I/O.
func New(cluster *kafkautil.Cluster, cfg Config) (*Bus, error) {
	if cluster == nil {
		return nil, fmt.Errorf("%w: cluster is nil", ErrConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var create *kafkautil.TopicSpec
	if !cfg.SkipCreateTopic {
		spec := kafkautil.CompactedTopic(cfg.Topic, cfg.Partitions, cfg.ReplicationFactor)
		spec.Config["cleanup.policy"] = "compact,delete"
		spec.Config["retention.ms"] = strconv.FormatInt(cfg.Retention.Milliseconds(), 10)
		create = &spec
	}
	p, err := cluster.NewProducer(kafkautil.DefaultWriterConfig(cfg.Topic), create)
	if err != nil {
		return nil, fmt.Errorf("kafkarepl: %w", err)
	}
	return &Bus{cfg: cfg, cluster: cluster, producer: p}, nil
}

// Stats returns a snapshot of the counters.
func (b *Bus) Stats() Stats {
	return Stats{Published: b.published.Load(), Consumed: b.consumed.Load(), Malformed: b.malformed.Load(), Restarts: b.restarts.Load()}
}

// Close flushes and closes the writer; Publish fails with ErrClosed after.
func (b *Bus) Close() error {
	if err := b.producer.Close(); err != nil {
		return fmt.Errorf("kafkarepl: %w", err)
	}
	return nil
}

// RecordKey is the Kafka key (and compaction key) of a count.
func RecordKey(k dailyquota.Key) string {
	return k.Subject + " " + k.Policy + " " + strconv.FormatInt(k.StartMs, 10) + " " + k.Region
}

// Encode returns the record value of c.
func Encode(c dailyquota.Count) ([]byte, error) {
	return proto.Marshal(&quotientv1.WindowCount{
		Subject: c.Subject, PolicyId: c.Policy, WindowStartUnixMs: c.StartMs, WindowMs: c.WindowMs,
		Region: c.Region, Count: c.N, UpdatedUnixMs: c.UpdatedMs,
	})
}

// Decode parses a record value; the count is not validated beyond decoding
// (dailyquota.Accept does that).
func Decode(v []byte) (dailyquota.Count, error) {
	var m quotientv1.WindowCount
	if err := proto.Unmarshal(v, &m); err != nil {
		return dailyquota.Count{}, fmt.Errorf("kafkarepl: decode window count: %w", err)
	}
	return dailyquota.Count{
		Key:      dailyquota.Key{Subject: m.GetSubject(), Policy: m.GetPolicyId(), StartMs: m.GetWindowStartUnixMs(), Region: m.GetRegion()},
		WindowMs: m.GetWindowMs(), N: m.GetCount(), UpdatedMs: m.GetUpdatedUnixMs(),
	}, nil
}

// Publish implements dailyquota.Bus: one record per count, blocking until
// all are acknowledged (acks=all) or the write fails. Invalid counts are
// refused before anything is sent.
func (b *Bus) Publish(ctx context.Context, counts []dailyquota.Count) error {
	if len(counts) == 0 {
		return nil
	}
	now := b.cfg.Now()
	msgs := make([]kafka.Message, len(counts))
	for i, c := range counts {
		if err := c.Validate(); err != nil {
			return fmt.Errorf("kafkarepl: publish: counts[%d]: %w", i, err)
		}
		v, err := Encode(c)
		if err != nil {
			return fmt.Errorf("kafkarepl: publish: counts[%d]: %w", i, err)
		}
		msgs[i] = kafka.Message{Key: []byte(RecordKey(c.Key)), Value: v, Time: now}
	}
	if err := b.producer.Write(ctx, msgs...); err != nil {
		if errors.Is(err, kafkautil.ErrClosed) {
			return ErrClosed
		}
		return fmt.Errorf("kafkarepl: publish %d counts to %q: %w", len(msgs), b.cfg.Topic, err)
	}
	b.published.Add(int64(len(msgs)))
	return nil
}

// Run implements dailyquota.Bus: it reads every partition of every
// consumed topic from its first offset (kafkautil.ConsumeTopics) and calls
// deliver with each count, from Run's goroutine, one at a time. A partition
// whose offset retention removed restarts at its first offset. It returns
// ctx.Err() when ctx ends, or the first reading error (after stopping every
// reader); the caller may call Run again, which replays the topics.
// Fetches are held at the broker kafkautil.DefaultFetchWait (5 s), so a
// count reaches Run about one round trip after it is published, from a
// broker up to 1 s away (with the former 500 ms wait, none arrived from a
// broker more than ~125 ms away), and stopping does not wait for them.
func (b *Bus) Run(ctx context.Context, deliver func(dailyquota.Count)) error {
	if deliver == nil {
		return fmt.Errorf("%w: deliver is nil", ErrConfig)
	}
	cc := kafkautil.ConsumeConfig{
		Topics:       b.cfg.ConsumeTopics,
		PollInterval: b.cfg.TopicPollInterval,
		Buffer:       256,
		StartOffsets: kafkautil.FirstOffsets,
		Restarted:    func(string, int, int64) { b.restarts.Add(1) },
	}
	err := kafkautil.ConsumeTopics(ctx, b.cluster, cc, func(_ context.Context, _ string, _ int, m kafka.Message) error {
		b.consumed.Add(1)
		if m.Value == nil {
			return nil // a tombstone: nothing to merge
		}
		c, err := Decode(m.Value)
		if err != nil || !strings.HasSuffix(string(m.Key), " "+c.Region) {
			b.malformed.Add(1)
			return nil
		}
		deliver(c)
		return nil
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("kafkarepl: %w", err)
	}
	return err
}
