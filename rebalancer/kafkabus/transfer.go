package kafkabus

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/quotientlabs/quotient/internal/kafkautil"
	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
)

// TransferTopicSuffix is appended to the usage-report topic to name the
// transfer topic by default: "quotient.usage-transfers".
const TransferTopicSuffix = "-transfers"

// TransferTopic returns the default transfer topic of a usage-report topic.
func TransferTopic(usageTopic string) string { return usageTopic + TransferTopicSuffix }

// ErrInvalidTransfer means a transfer message is malformed: PublishAsk and
// PublishGive sent nothing; Run skipped and counted it
// (TransferStats.Malformed).
var ErrInvalidTransfer = errors.New("kafkabus: invalid transfer message")

// TransferConfig configures a TransferBus. Start from
// DefaultTransferConfig.
type TransferConfig struct {
	// Topic PublishAsk and PublishGive write to. Default
	// TransferTopic(DefaultTopic).
	Topic string
	// ConsumeTopics are the topics Run reads, all partitions of each.
	// Default: []string{Topic} (MirroredTopics for the MirrorMaker 2
	// layout, as for reports).
	ConsumeTopics []string
	// MaxMessageBytes bounds one message, bytes: an ask larger than that is
	// split into several asks (each one on its own), a give larger than
	// that is refused. Same rules as Config.MaxMessageBytes. Default
	// 1,000,000.
	MaxMessageBytes int
	// Lookback is how far back a consumer starts (the record timestamp, as
	// for reports). Asks and gives are worth something for about a second,
	// and receivers refuse the stale ones, so it is short. Default 10 s.
	Lookback time.Duration
	// SkipCreateTopic stops the first publication from creating Topic.
	// Default false.
	SkipCreateTopic bool
	// Partitions of a Topic the bus creates. Default 3; -1: the broker's.
	Partitions int
	// ReplicationFactor of a Topic the bus creates. Default -1: the
	// broker's default.replication.factor.
	ReplicationFactor int
	// Retention of a Topic the bus creates. Default 1 h.
	Retention time.Duration
	// TopicPollInterval: as Config.TopicPollInterval. Default 5 s.
	TopicPollInterval time.Duration
	// BatchTimeout is how long the producer waits to fill a batch: a
	// transfer is latency, not throughput. Default 2 ms.
	BatchTimeout time.Duration
	// FetchWait: as Config.FetchWait (every partition reader long-polls,
	// so an ask reaches the others half a round trip after it lands).
	// At least 2 s. Default 5 s.
	FetchWait time.Duration
	// WarmInterval: as Config.WarmInterval. Default 10 s.
	WarmInterval time.Duration
	// Now is the clock for record timestamps and the consumer's start.
	// Nil means time.Now.
	Now func() time.Time
	// OnMalformed, when set, is called from Run's goroutine with the error
	// (wrapping ErrInvalidTransfer, naming the topic, partition, offset and
	// what was wrong) of each message it skips. It must not block.
	OnMalformed func(error)
}

// DefaultTransferConfig returns the defaults for the shared layout.
func DefaultTransferConfig() TransferConfig {
	return TransferConfig{
		Topic:             TransferTopic(DefaultTopic),
		MaxMessageBytes:   1_000_000,
		Lookback:          10 * time.Second,
		Partitions:        3,
		ReplicationFactor: -1,
		Retention:         time.Hour,
		TopicPollInterval: 5 * time.Second,
		BatchTimeout:      2 * time.Millisecond,
		FetchWait:         5 * time.Second,
		WarmInterval:      10 * time.Second,
	}
}

// Validate fills zero fields with defaults and rejects bad values, naming
// the field.
func (c *TransferConfig) Validate() error {
	d := DefaultTransferConfig()
	shared := kafkautil.BusConfig{
		Topic: c.Topic, ConsumeTopics: c.ConsumeTopics, Partitions: c.Partitions, ReplicationFactor: c.ReplicationFactor,
		Retention: c.Retention, TopicPollInterval: c.TopicPollInterval, Now: c.Now,
	}
	if err := shared.Fill(kafkautil.BusConfig{
		Topic: d.Topic, Partitions: d.Partitions, ReplicationFactor: d.ReplicationFactor,
		Retention: d.Retention, TopicPollInterval: d.TopicPollInterval,
	}, ErrConfig); err != nil {
		return fmt.Errorf("transfer bus: %w", err)
	}
	c.Topic, c.ConsumeTopics, c.Partitions, c.ReplicationFactor = shared.Topic, shared.ConsumeTopics, shared.Partitions, shared.ReplicationFactor
	c.Retention, c.TopicPollInterval, c.Now = shared.Retention, shared.TopicPollInterval, shared.Now
	for _, f := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"lookback", &c.Lookback, d.Lookback},
		{"batch timeout", &c.BatchTimeout, d.BatchTimeout},
		{"fetch wait", &c.FetchWait, d.FetchWait},
		{"warm interval", &c.WarmInterval, d.WarmInterval},
	} {
		if *f.v == 0 {
			*f.v = f.def
		}
		if *f.v < 0 {
			return fmt.Errorf("%w: transfer bus: %s %v: must not be negative", ErrConfig, f.name, *f.v)
		}
	}
	if c.FetchWait < minFetchWait {
		return fmt.Errorf("%w: transfer bus: fetch wait %v: want at least %v (kafka-go keeps 1 s of it for the round trip)", ErrConfig, c.FetchWait, minFetchWait)
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = d.MaxMessageBytes
	}
	if c.MaxMessageBytes < 4096 {
		return fmt.Errorf("%w: transfer bus: max message bytes %d: want at least 4096", ErrConfig, c.MaxMessageBytes)
	}
	return nil
}

// TransferStats counts what a TransferBus did since NewTransferBus.
type TransferStats struct {
	PublishedAsks     int64 // asks PublishAsk sent (before splitting)
	PublishedGives    int64 // gives PublishGive sent
	PublishedMessages int64 // Kafka messages sent
	ConsumedMessages  int64 // Kafka messages Run read
	DeliveredAsks     int64 // asks Run delivered
	DeliveredGives    int64 // gives Run delivered
	Malformed         int64 // messages Run skipped: undecodable or invalid
	MissingTopics     int64 // consumed topics Run is waiting for now
	PrepareErrors     int64 // Prepare calls that failed
}

type transferCounters struct {
	asks, gives, msgs, consumed, deliveredAsks, deliveredGives, malformed, missing atomic.Int64
}

// TransferBus publishes this region's asks and gives and consumes every
// region's, on the transfer topic: one message per ask (or part of one)
// or give, keyed by the sending region (so one region's messages stay in
// order), value a serialized quotientv1.TransferMessage, timestamp the
// publisher's clock. Delivery is at least once and unordered across
// regions; the rebalancer's rules make asks and gives safe to duplicate,
// reorder and lose. Construct with NewTransferBus; PublishAsk,
// PublishGive, Prepare and Stats are safe for concurrent use; run one Run
// at a time.
type TransferBus struct {
	cfg      TransferConfig
	cluster  *kafkautil.Cluster
	producer *busProducer
	stats    transferCounters
}

// NewTransferBus returns a TransferBus on cluster (owned by the caller,
// closed after the bus). It does no I/O.
func NewTransferBus(cluster *kafkautil.Cluster, cfg TransferConfig) (*TransferBus, error) {
	if cluster == nil {
		return nil, fmt.Errorf("%w: transfer bus: cluster is nil", ErrConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var create *kafkautil.TopicSpec
	if !cfg.SkipCreateTopic {
		spec := TransferTopicSpec(cfg)
		create = &spec
	}
	p, err := newBusProducer(cluster, cfg.Topic, cfg.MaxMessageBytes, cfg.BatchTimeout, create)
	if err != nil {
		return nil, fmt.Errorf("kafkabus: transfer bus: %w", err)
	}
	return &TransferBus{cfg: cfg, cluster: cluster, producer: p}, nil
}

// TransferTopicSpec is the topic a TransferBus of cfg (validated) creates:
// cleanup.policy=delete, retention cfg.Retention, max.message.bytes above
// MaxMessageBytes.
func TransferTopicSpec(cfg TransferConfig) kafkautil.TopicSpec {
	return busTopicSpec(cfg.Topic, cfg.Partitions, cfg.ReplicationFactor, cfg.Retention, cfg.MaxMessageBytes)
}

// Topic returns the topic the bus publishes to.
func (b *TransferBus) Topic() string { return b.cfg.Topic }

// Stats returns a snapshot of the counters.
func (b *TransferBus) Stats() TransferStats {
	s := &b.stats
	return TransferStats{
		PublishedAsks: s.asks.Load(), PublishedGives: s.gives.Load(), PublishedMessages: s.msgs.Load(),
		ConsumedMessages: s.consumed.Load(), DeliveredAsks: s.deliveredAsks.Load(), DeliveredGives: s.deliveredGives.Load(),
		Malformed: s.malformed.Load(), MissingTopics: s.missing.Load(), PrepareErrors: b.producer.prepareErrors.Load(),
	}
}

// Close flushes and closes the producer; publications fail with ErrClosed
// afterwards.
func (b *TransferBus) Close() error {
	if err := b.producer.p.Close(); err != nil {
		return fmt.Errorf("kafkabus: transfer bus: %w", err)
	}
	return nil
}

// Prepare readies the producer (topic created unless SkipCreateTopic,
// metadata, connections), as Bus.Prepare; Run calls it at start and every
// WarmInterval.
func (b *TransferBus) Prepare(ctx context.Context) error { return b.producer.prepare(ctx) }

// PublishAsk sends a (validated: see CheckAsk) to Topic and blocks until it
// is acknowledged by all in-sync replicas or fails. An ask larger than
// MaxMessageBytes goes as several asks, each with a part of the keys
// (every part valid on its own). The caller keeps a. On error some parts
// may have been sent; sending the ask again is safe.
func (b *TransferBus) PublishAsk(ctx context.Context, a *quotientv1.TransferAsk) error {
	if err := CheckAsk(a); err != nil {
		return err
	}
	header := &quotientv1.TransferAsk{Region: a.GetRegion(), Epoch: a.GetEpoch(), EpochMs: a.GetEpochMs(), SentUnixMs: a.GetSentUnixMs()}
	budget := b.cfg.MaxMessageBytes - len(a.GetRegion()) - recordOverhead - proto.Size(&quotientv1.TransferMessage{Kind: &quotientv1.TransferMessage_Ask{Ask: header}}) - 8
	var parts []*quotientv1.TransferAsk
	cur := proto.Clone(header).(*quotientv1.TransferAsk)
	used := 0
	for i, k := range a.GetKeys() {
		n := proto.Size(k)
		n += protowire.SizeTag(5) + protowire.SizeVarint(uint64(n))
		if n > budget {
			return fmt.Errorf("%w: ask of region %q: keys[%d] (policy %q, subject %q) needs %d bytes, more than fits in one message of %d bytes",
				ErrInvalidTransfer, a.GetRegion(), i, k.GetPolicyId(), k.GetSubject(), n, b.cfg.MaxMessageBytes)
		}
		if used+n > budget {
			parts = append(parts, cur)
			cur = proto.Clone(header).(*quotientv1.TransferAsk)
			used = 0
		}
		cur.Keys = append(cur.Keys, k)
		used += n
	}
	parts = append(parts, cur)
	msgs := make([]kafka.Message, len(parts))
	for i, p := range parts {
		v, err := proto.Marshal(&quotientv1.TransferMessage{Kind: &quotientv1.TransferMessage_Ask{Ask: p}})
		if err != nil {
			return fmt.Errorf("%w: ask of region %q: encode: %v", ErrInvalidTransfer, a.GetRegion(), err)
		}
		msgs[i] = kafka.Message{Key: []byte(a.GetRegion()), Value: v, Time: b.cfg.Now()}
	}
	if err := b.write(ctx, msgs); err != nil {
		return fmt.Errorf("kafkabus: publish ask of region %q epoch %d (%d keys, %d messages) to %q: %w", a.GetRegion(), a.GetEpoch(), len(a.GetKeys()), len(msgs), b.cfg.Topic, err)
	}
	b.stats.asks.Add(1)
	return nil
}

// PublishGive sends g (validated: see CheckGive) to Topic as one message
// and blocks until it is acknowledged by all in-sync replicas or fails. A
// give larger than MaxMessageBytes is an error wrapping
// ErrInvalidTransfer (a give is applied whole or not at all). The caller
// keeps g. Publishing the same give again is safe: receivers dedupe by
// (from, id).
func (b *TransferBus) PublishGive(ctx context.Context, g *quotientv1.TransferGive) error {
	if err := CheckGive(g); err != nil {
		return err
	}
	v, err := proto.Marshal(&quotientv1.TransferMessage{Kind: &quotientv1.TransferMessage_Give{Give: g}})
	if err != nil {
		return fmt.Errorf("%w: give %s/%d: encode: %v", ErrInvalidTransfer, g.GetFrom(), g.GetId(), err)
	}
	if n := len(v) + len(g.GetFrom()) + recordOverhead; n > b.cfg.MaxMessageBytes {
		return fmt.Errorf("%w: give %s/%d: %d keys need %d bytes, more than one message of %d bytes", ErrInvalidTransfer, g.GetFrom(), g.GetId(), len(g.GetKeys()), n, b.cfg.MaxMessageBytes)
	}
	if err := b.write(ctx, []kafka.Message{{Key: []byte(g.GetFrom()), Value: v, Time: b.cfg.Now()}}); err != nil {
		return fmt.Errorf("kafkabus: publish give %s/%d to %s (%d keys) to %q: %w", g.GetFrom(), g.GetId(), g.GetTo(), len(g.GetKeys()), b.cfg.Topic, err)
	}
	b.stats.gives.Add(1)
	return nil
}

func (b *TransferBus) write(ctx context.Context, msgs []kafka.Message) error {
	if err := b.producer.p.Write(ctx, msgs...); err != nil {
		if errors.Is(err, kafkautil.ErrClosed) {
			return ErrClosed
		}
		return err
	}
	b.stats.msgs.Add(int64(len(msgs)))
	return nil
}

// CheckAsk returns an error wrapping ErrInvalidTransfer, naming the field,
// when a is not a valid ask: region empty, epoch_ms <= 0, no keys, a nil
// key, an empty policy or subject, need_rate_milli <= 0 or
// need_burst_milli < 0.
func CheckAsk(a *quotientv1.TransferAsk) error {
	switch {
	case a == nil:
		return fmt.Errorf("%w: ask is nil", ErrInvalidTransfer)
	case a.GetRegion() == "":
		return fmt.Errorf("%w: ask: region is empty", ErrInvalidTransfer)
	case a.GetEpochMs() <= 0:
		return fmt.Errorf("%w: ask of region %q: epoch_ms %d, want > 0", ErrInvalidTransfer, a.GetRegion(), a.GetEpochMs())
	case len(a.GetKeys()) == 0:
		return fmt.Errorf("%w: ask of region %q: no keys", ErrInvalidTransfer, a.GetRegion())
	}
	for i, k := range a.GetKeys() {
		switch {
		case k == nil:
			return fmt.Errorf("%w: ask of region %q: keys[%d] is nil", ErrInvalidTransfer, a.GetRegion(), i)
		case k.GetPolicyId() == "" || k.GetSubject() == "":
			return fmt.Errorf("%w: ask of region %q: keys[%d]: policy %q, subject %q: both are required", ErrInvalidTransfer, a.GetRegion(), i, k.GetPolicyId(), k.GetSubject())
		case k.GetNeedRateMilli() <= 0 || k.GetNeedBurstMilli() < 0:
			return fmt.Errorf("%w: ask of region %q: keys[%d] (%s/%s): need rate %d, burst %d milli: want rate > 0, burst >= 0",
				ErrInvalidTransfer, a.GetRegion(), i, k.GetPolicyId(), k.GetSubject(), k.GetNeedRateMilli(), k.GetNeedBurstMilli())
		}
	}
	return nil
}

// CheckGive returns an error wrapping ErrInvalidTransfer, naming the
// field, when g is not a valid give: from or to empty or equal, id <= 0,
// transfer < 1, epoch_ms <= 0, no keys, a nil key, an empty policy or
// subject, a negative amount, or an amount of zero in both dimensions.
func CheckGive(g *quotientv1.TransferGive) error {
	switch {
	case g == nil:
		return fmt.Errorf("%w: give is nil", ErrInvalidTransfer)
	case g.GetFrom() == "" || g.GetTo() == "":
		return fmt.Errorf("%w: give: from %q, to %q: both are required", ErrInvalidTransfer, g.GetFrom(), g.GetTo())
	case g.GetFrom() == g.GetTo():
		return fmt.Errorf("%w: give from %q to itself", ErrInvalidTransfer, g.GetFrom())
	case g.GetId() <= 0:
		return fmt.Errorf("%w: give from %q: id %d, want > 0", ErrInvalidTransfer, g.GetFrom(), g.GetId())
	case g.GetTransfer() < 1:
		return fmt.Errorf("%w: give %s/%d: transfer epoch %d, want >= 1", ErrInvalidTransfer, g.GetFrom(), g.GetId(), g.GetTransfer())
	case g.GetEpochMs() <= 0:
		return fmt.Errorf("%w: give %s/%d: epoch_ms %d, want > 0", ErrInvalidTransfer, g.GetFrom(), g.GetId(), g.GetEpochMs())
	case len(g.GetKeys()) == 0:
		return fmt.Errorf("%w: give %s/%d: no keys", ErrInvalidTransfer, g.GetFrom(), g.GetId())
	}
	for i, k := range g.GetKeys() {
		switch {
		case k == nil:
			return fmt.Errorf("%w: give %s/%d: keys[%d] is nil", ErrInvalidTransfer, g.GetFrom(), g.GetId(), i)
		case k.GetPolicyId() == "" || k.GetSubject() == "":
			return fmt.Errorf("%w: give %s/%d: keys[%d]: policy %q, subject %q: both are required", ErrInvalidTransfer, g.GetFrom(), g.GetId(), i, k.GetPolicyId(), k.GetSubject())
		case k.GetAmountRateMilli() < 0 || k.GetAmountBurstMilli() < 0 || k.GetAmountRateMilli()+k.GetAmountBurstMilli() == 0:
			return fmt.Errorf("%w: give %s/%d: keys[%d] (%s/%s): amount rate %d, burst %d milli: want both >= 0, not both 0",
				ErrInvalidTransfer, g.GetFrom(), g.GetId(), i, k.GetPolicyId(), k.GetSubject(), k.GetAmountRateMilli(), k.GetAmountBurstMilli())
		}
	}
	return nil
}

// Run reads every partition of every ConsumeTopics topic, from Lookback
// before now, and calls deliver with each valid message (an ask or a
// give, every region's, this one's too), from Run's goroutine, one call at
// a time; deliver owns the message and should return quickly (reading
// stalls meanwhile). A message that does not decode, holds neither an ask
// nor a give, or fails CheckAsk or CheckGive is skipped, counted
// (TransferStats.Malformed) and passed to OnMalformed. Run also keeps the
// producer ready (Prepare at start and every WarmInterval). It blocks until
// ctx ends (then returns ctx.Err()) or reading fails (that error, wrapped);
// the caller may call Run again.
func (b *TransferBus) Run(ctx context.Context, deliver func(*quotientv1.TransferMessage)) error {
	if deliver == nil {
		return fmt.Errorf("%w: transfer bus: deliver is nil", ErrConfig)
	}
	defer b.producer.keepWarm(ctx, b.cfg.WarmInterval)()
	cc := consumeConfig(b.cluster, b.cfg.ConsumeTopics, b.cfg.TopicPollInterval, b.cfg.FetchWait, b.cfg.Lookback, b.cfg.MaxMessageBytes, b.cfg.Now, &b.stats.missing)
	err := kafkautil.ConsumeTopics(ctx, b.cluster, cc, func(_ context.Context, topic string, partition int, m kafka.Message) error {
		b.stats.consumed.Add(1)
		msg, err := decodeTransfer(m.Value)
		if err != nil {
			b.stats.malformed.Add(1)
			if b.cfg.OnMalformed != nil {
				b.cfg.OnMalformed(fmt.Errorf("%s partition %d offset %d: %w", topic, partition, m.Offset, err))
			}
			return nil
		}
		if msg.GetAsk() != nil {
			b.stats.deliveredAsks.Add(1)
		} else {
			b.stats.deliveredGives.Add(1)
		}
		deliver(msg)
		return nil
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("kafkabus: transfer bus: %w", err)
	}
	return err
}

// decodeTransfer decodes and checks one message's value.
func decodeTransfer(v []byte) (*quotientv1.TransferMessage, error) {
	msg := &quotientv1.TransferMessage{}
	if err := proto.Unmarshal(v, msg); err != nil {
		return nil, fmt.Errorf("%w: %d bytes do not decode as a TransferMessage: %v", ErrInvalidTransfer, len(v), err)
	}
	switch {
	case msg.GetAsk() != nil:
		return msg, CheckAsk(msg.GetAsk())
	case msg.GetGive() != nil:
		return msg, CheckGive(msg.GetGive())
	}
	return nil, fmt.Errorf("%w: neither an ask nor a give (%d bytes; an unknown kind from a newer sender?)", ErrInvalidTransfer, len(v))
}
