package kafkabus

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/quotientlabs/quotient/internal/kafkautil"
	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
)

// DefaultTopic is the usage-report topic (shared layout), and the local
// topic each region publishes to in the mirrored layout.
const DefaultTopic = "quotient.usage"

// Errors callers branch on.
var (
	// ErrConfig wraps every configuration error.
	ErrConfig = errors.New("kafkabus: invalid config")
	// ErrInvalidReport means Publish rejected the report; nothing was sent.
	ErrInvalidReport = errors.New("kafkabus: invalid report")
	// ErrClosed is returned by Publish after Close.
	ErrClosed = errors.New("kafkabus: closed")
)

// minFetchWait is the shortest Config.FetchWait: kafka-go's reader keeps
// 1 s of its fetch wait for the round trip, so less leaves the broker
// nothing to hold and the reader polls.
const minFetchWait = 2 * time.Second

// recordOverhead is what a Kafka record adds to its key and value in
// kafka-go's size estimate (and more than the v2 record format adds), plus
// room for the batch header when a batch holds a single record.
const recordOverhead = 128

// MirroredTopics returns the topics a region consumes in the MirrorMaker 2
// layout: its local topic and "<region>.<topic>" for each remote region.
func MirroredTopics(topic string, remoteRegions ...string) []string {
	return kafkautil.MirroredTopics(topic, remoteRegions...)
}

// Config configures a Bus. Start from DefaultConfig.
type Config struct {
	// Topic Publish writes to. Default DefaultTopic.
	Topic string
	// ConsumeTopics are the topics Run reads, all partitions of each.
	// Default: []string{Topic}. See MirroredTopics for the MirrorMaker 2
	// layout.
	ConsumeTopics []string
	// MaxMessageBytes bounds one Kafka message (one report part) and one
	// produce batch, bytes. It must not exceed the topic's max.message.bytes
	// (Kafka's default is 1,048,588; a topic the Bus creates gets
	// MaxMessageBytes + 4096). Default 1,000,000. Minimum 4096.
	MaxMessageBytes int
	// Lookback is how far back a consumer starts: at the first record whose
	// timestamp is at or after now - Lookback when Run finds a partition.
	// Default 60 s (six epochs of 10 s).
	Lookback time.Duration
	// SkipCreateTopic stops the first Publish from creating Topic when it
	// does not exist (for clusters where topics are managed elsewhere).
	// Default false: the Bus creates its topic.
	SkipCreateTopic bool
	// Partitions of a Topic the Bus creates. Default 3; -1 means the
	// broker's default. A coordinator with key parts wants at least as
	// many as its parts, so that each part's reports have a partition of
	// their own (PartitionOf; region.Config.Parts creates max(3, Parts));
	// an existing topic keeps its count: with fewer partitions than parts,
	// parts share partitions, which is still correct, just less split.
	Partitions int
	// ReplicationFactor of a Topic the Bus creates. Default -1, the broker's
	// default.replication.factor.
	ReplicationFactor int
	// Retention of a Topic the Bus creates. Default 1 h: far more than the
	// Lookback, little disk.
	Retention time.Duration
	// TopicPollInterval is how often Run checks again for a consumed topic
	// that does not exist yet, and for partitions added to known topics.
	// Default 5 s; while a topic is missing Run checks sooner at first
	// (from 50 ms, doubling up to this interval).
	TopicPollInterval time.Duration
	// MaxPendingReports bounds incomplete reports held per region; beyond
	// it, the one with the lowest seq is dropped. Default 8.
	MaxPendingReports int
	// FetchWait is how long each partition reader's fetch may stay open,
	// so that the broker always holds a fetch to answer the moment a report
	// lands (a report then costs the consumer half a round trip, not a
	// fetch cycle). kafka-go keeps 1 s of it for the round trip and lets
	// the broker hold the rest, so it must be at least 2 s, and a round
	// trip to the broker above 1 s turns every idle fetch into a
	// reconnection. Default 5 s.
	FetchWait time.Duration
	// WarmInterval is how often Run calls Prepare again, keeping the
	// producer's connections open between reports (kafka-go closes a
	// connection after 30 s without a request). Default 10 s.
	WarmInterval time.Duration
	// Now is the clock for record timestamps and the consumer's start time.
	// Nil means time.Now.
	Now func() time.Time
}

// DefaultConfig returns the defaults for the shared layout.
func DefaultConfig() Config {
	return Config{
		Topic:             DefaultTopic,
		MaxMessageBytes:   1_000_000,
		Lookback:          60 * time.Second,
		Partitions:        3,
		ReplicationFactor: -1,
		Retention:         time.Hour,
		TopicPollInterval: 5 * time.Second,
		MaxPendingReports: 8,
		FetchWait:         5 * time.Second,
		WarmInterval:      10 * time.Second,
	}
}

// Validate fills zero fields with defaults and rejects bad values, naming
// the field.
func (c *Config) Validate() error {
	d := DefaultConfig()
	shared := c.busConfig()
	if err := shared.Fill(d.busConfig(), ErrConfig); err != nil {
		return err
	}
	c.Topic, c.ConsumeTopics, c.Partitions, c.ReplicationFactor = shared.Topic, shared.ConsumeTopics, shared.Partitions, shared.ReplicationFactor
	c.Retention, c.TopicPollInterval, c.Now = shared.Retention, shared.TopicPollInterval, shared.Now
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = d.MaxMessageBytes
	}
	if c.MaxMessageBytes < 4096 {
		return fmt.Errorf("%w: max message bytes %d: want at least 4096", ErrConfig, c.MaxMessageBytes)
	}
	if c.Lookback == 0 {
		c.Lookback = d.Lookback
	}
	if c.Lookback < 0 {
		return fmt.Errorf("%w: lookback %v: must not be negative", ErrConfig, c.Lookback)
	}
	if c.MaxPendingReports == 0 {
		c.MaxPendingReports = d.MaxPendingReports
	}
	if c.MaxPendingReports < 0 {
		return fmt.Errorf("%w: max pending reports %d: must not be negative", ErrConfig, c.MaxPendingReports)
	}
	if c.FetchWait == 0 {
		c.FetchWait = d.FetchWait
	}
	if c.FetchWait < minFetchWait {
		return fmt.Errorf("%w: fetch wait %v: want at least %v (kafka-go keeps 1 s of it for the round trip)", ErrConfig, c.FetchWait, minFetchWait)
	}
	if c.WarmInterval == 0 {
		c.WarmInterval = d.WarmInterval
	}
	if c.WarmInterval < 0 {
		return fmt.Errorf("%w: warm interval %v: must not be negative", ErrConfig, c.WarmInterval)
	}
	return nil
}

// busConfig is the part of c every bus shares, which kafkautil checks.
func (c *Config) busConfig() kafkautil.BusConfig {
	return kafkautil.BusConfig{
		Topic: c.Topic, ConsumeTopics: c.ConsumeTopics, Partitions: c.Partitions, ReplicationFactor: c.ReplicationFactor,
		Retention: c.Retention, TopicPollInterval: c.TopicPollInterval, Now: c.Now,
	}
}

// Stats counts what the Bus did since New, over all Publish and Run calls.
type Stats struct {
	PublishedReports int64 // reports Publish sent
	PublishedParts   int64 // messages Publish sent
	ConsumedParts    int64 // messages Run read
	SkippedParts     int64 // messages RunPart or RunKeys skipped undecoded (another key part's)
	DeliveredReports int64 // whole reports Run delivered
	Duplicates       int64 // parts dropped as duplicates of held or recently delivered ones
	Malformed        int64 // messages that did not decode or were not valid parts
	Evicted          int64 // incomplete reports dropped (a part never arrived)
	MissingTopics    int64 // consumed topics Run is currently waiting for
	PrepareErrors    int64 // Prepare calls (Run's included) that failed
}

type counters struct {
	publishedReports, publishedParts, consumedParts, deliveredReports atomic.Int64
	duplicates, malformed, evicted, missingTopics, skippedParts       atomic.Int64
}

// Bus publishes this region's usage reports and consumes every region's.
// Construct with New. Publish and Run are safe for concurrent use; several
// Run calls may run at once, each reading every consumed topic on its own.
type Bus struct {
	cfg      Config
	cluster  *kafkautil.Cluster
	producer *busProducer
	stats    counters
	// protoKeys makes encode write keys with proto.Marshal, as before
	// keycodec.go (benchmarks compare the two).
	protoKeys bool
}

// New returns a Bus on cluster. It does no I/O. The caller keeps ownership
// of cluster and closes it after closing the Bus.
func New(cluster *kafkautil.Cluster, cfg Config) (*Bus, error) {
	if cluster == nil {
		return nil, fmt.Errorf("%w: cluster is nil", ErrConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var create *kafkautil.TopicSpec
	if !cfg.SkipCreateTopic {
		spec := busTopicSpec(cfg.Topic, cfg.Partitions, cfg.ReplicationFactor, cfg.Retention, cfg.MaxMessageBytes)
		create = &spec
	}
	p, err := newBusProducer(cluster, cfg.Topic, cfg.MaxMessageBytes, 0, create)
	if err != nil {
		return nil, fmt.Errorf("kafkabus: %w", err)
	}
	return &Bus{cfg: cfg, cluster: cluster, producer: p}, nil
}

// Stats returns a snapshot of the counters.
func (b *Bus) Stats() Stats {
	s := &b.stats
	return Stats{
		PublishedReports: s.publishedReports.Load(), PublishedParts: s.publishedParts.Load(),
		ConsumedParts: s.consumedParts.Load(), DeliveredReports: s.deliveredReports.Load(),
		Duplicates: s.duplicates.Load(), Malformed: s.malformed.Load(), Evicted: s.evicted.Load(),
		MissingTopics: s.missingTopics.Load(), PrepareErrors: b.producer.prepareErrors.Load(),
		SkippedParts: s.skippedParts.Load(),
	}
}

// Close flushes and closes the writer. Publish fails with ErrClosed
// afterwards; running Run calls are stopped by their own contexts.
func (b *Bus) Close() error {
	if err := b.producer.p.Close(); err != nil {
		return fmt.Errorf("kafkabus: %w", err)
	}
	return nil
}

// Prepare readies the producer so that the next Publish costs one produce
// round trip (see kafkautil.Producer.Prepare): Topic created (unless
// SkipCreateTopic), its metadata loaded, a connection open to each of its
// partition leaders. Without it the first Publish does all of that within
// its own deadline: several round trips to the broker, which a far broker
// and a short deadline (the driver's IOTimeout) do not allow. Run calls it
// at start and every WarmInterval. It blocks until done or ctx ends; an
// error (counted in Stats.PrepareErrors) changes nothing for later calls
// or Publish. Safe for concurrent use.
func (b *Bus) Prepare(ctx context.Context) error { return b.producer.prepare(ctx) }

// Publish sends r to Config.Topic, split into parts of at most
// MaxMessageBytes, and blocks until every part is acknowledged by all
// in-sync replicas, or fails. r must be a whole report (part 0, parts 0 or
// 1) with a region, epoch_ms > 0 (or, for a delta, base_epoch > 0,
// delta_epoch_ms > 0 and epoch_ms 0) and seq >= 1; Publish sets part and parts
// on the messages it sends and does not modify r, which the caller keeps
// (it must not change r during the call). An unknown topic (just created,
// or created elsewhere) is retried for up to 10 s. On error some parts may
// have been sent: publishing the same report again is safe, because
// receivers dedupe by (region, epoch, seq).
func (b *Bus) Publish(ctx context.Context, r *quotientv1.UsageReport) error {
	return b.publish(ctx, r, newProtoKeys(r.GetKeys(), b.protoKeys))
}

// publish is Publish of the report of header r (its keys ignored) and
// keys.
func (b *Bus) publish(ctx context.Context, r *quotientv1.UsageReport, keys keySource) error {
	msgs, err := b.encodeKeys(r, keys)
	if err != nil {
		return err
	}
	if err := b.producer.p.Write(ctx, msgs...); err != nil {
		if errors.Is(err, kafkautil.ErrClosed) {
			return ErrClosed
		}
		return fmt.Errorf("kafkabus: publish report region %q epoch %d seq %d (%d parts) to %q: %w",
			r.GetRegion(), r.GetEpoch(), r.GetSeq(), len(msgs), b.cfg.Topic, err)
	}
	b.stats.publishedReports.Add(1)
	b.stats.publishedParts.Add(int64(len(msgs)))
	return nil
}

// partHeader returns part part of parts of report r, without keys.
func partHeader(r *quotientv1.UsageReport, part, parts int32) *quotientv1.UsageReport {
	return &quotientv1.UsageReport{
		Region: r.GetRegion(), Epoch: r.GetEpoch(), EpochMs: r.GetEpochMs(), Seq: r.GetSeq(),
		SentUnixMs: r.GetSentUnixMs(), Heard: r.GetHeard(),
		StartedEpoch: r.GetStartedEpoch(), Relayed: r.GetRelayed(),
		KeyPart: r.GetKeyPart(), KeyParts: r.GetKeyParts(),
		BaseEpoch: r.GetBaseEpoch(), DeltaEpochMs: r.GetDeltaEpochMs(), AcceptsDelta: r.GetAcceptsDelta(),
		Part: part, Parts: parts,
	}
}

// encode validates r and splits it into messages.
func (b *Bus) encode(r *quotientv1.UsageReport) ([]kafka.Message, error) {
	return b.encodeKeys(r, newProtoKeys(r.GetKeys(), b.protoKeys))
}

// encodeKeys validates the report of header r (its keys ignored) and
// keys, and splits it into messages: each part is r's fields, then the
// keys that fit (fields in another order than proto.Marshal's, which
// every reader accepts).
func (b *Bus) encodeKeys(r *quotientv1.UsageReport, keys keySource) ([]kafka.Message, error) {
	switch {
	case r == nil:
		return nil, fmt.Errorf("%w: report is nil", ErrInvalidReport)
	case r.GetRegion() == "":
		return nil, fmt.Errorf("%w: region is empty", ErrInvalidReport)
	case r.GetBaseEpoch() == 0 && r.GetEpochMs() <= 0:
		return nil, fmt.Errorf("%w: region %q: epoch_ms %d, want > 0", ErrInvalidReport, r.GetRegion(), r.GetEpochMs())
	case r.GetBaseEpoch() != 0 && (r.GetBaseEpoch() < 0 || r.GetEpochMs() != 0 || r.GetDeltaEpochMs() <= 0):
		return nil, fmt.Errorf("%w: region %q: delta of base %d with epoch_ms %d and delta_epoch_ms %d, want base > 0, 0 and > 0",
			ErrInvalidReport, r.GetRegion(), r.GetBaseEpoch(), r.GetEpochMs(), r.GetDeltaEpochMs())
	case r.GetSeq() < 1:
		return nil, fmt.Errorf("%w: region %q: seq %d, want >= 1", ErrInvalidReport, r.GetRegion(), r.GetSeq())
	case r.GetPart() != 0 || r.GetParts() > 1:
		return nil, fmt.Errorf("%w: region %q: part %d of %d: publish whole reports, Publish splits them",
			ErrInvalidReport, r.GetRegion(), r.GetPart(), r.GetParts())
	case r.GetKeyParts() < 0 || r.GetKeyPart() < 0 || r.GetKeyPart() >= max(1, r.GetKeyParts()):
		return nil, fmt.Errorf("%w: region %q: key part %d of %d, want 0 <= key_part < key_parts",
			ErrInvalidReport, r.GetRegion(), r.GetKeyPart(), r.GetKeyParts())
	}
	headerSize := proto.Size(partHeader(r, math.MaxInt32, math.MaxInt32)) // the widest varints
	budget := b.cfg.MaxMessageBytes - len(r.GetRegion()) - recordOverhead - headerSize
	// Greedy packing: each part gets as many consecutive keys as fit.
	var bounds []int // end index of each part's keys
	var sizes []int  // bytes of each part's keys
	used := 0
	for i := range keys.len() {
		n, err := keys.size(i)
		if err != nil {
			return nil, fmt.Errorf("%w: region %q: %v", ErrInvalidReport, r.GetRegion(), err)
		}
		n += protowire.SizeTag(fieldReportKeys) + protowire.SizeVarint(uint64(n))
		if n > budget {
			policy, subject := keys.name(i)
			return nil, fmt.Errorf("%w: region %q: keys[%d] (policy %q, subject %q) needs %d bytes, more than fits in one message of %d bytes",
				ErrInvalidReport, r.GetRegion(), i, policy, subject, n, b.cfg.MaxMessageBytes)
		}
		if used+n > budget {
			bounds = append(bounds, i)
			sizes = append(sizes, used)
			used = 0
		}
		used += n
	}
	bounds = append(bounds, keys.len())
	sizes = append(sizes, used)
	if len(bounds) > maxParts {
		return nil, fmt.Errorf("%w: region %q: report needs %d parts, more than %d", ErrInvalidReport, r.GetRegion(), len(bounds), maxParts)
	}

	now := b.cfg.Now()
	msgs := make([]kafka.Message, len(bounds))
	// The message key is the sender's region (and key part, with key
	// parts): the messages of one sender stay in one partition, in order.
	// With key parts, the KeyPartHeader places them on the part's
	// partition (PartitionOf), not the key's hash.
	key := []byte(r.GetRegion())
	if r.GetKeyParts() > 1 {
		key = []byte(r.GetRegion() + "/" + strconv.Itoa(int(r.GetKeyPart())))
	}
	headers := keyPartHeaders(r.GetKeyPart(), r.GetKeyParts())
	lo := 0
	for i, hi := range bounds {
		v, err := proto.MarshalOptions{}.MarshalAppend(make([]byte, 0, headerSize+sizes[i]), partHeader(r, int32(i), int32(len(bounds))))
		for j := lo; j < hi && err == nil; j++ {
			v, err = keys.entry(v, j)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: region %q: encode part %d: %v", ErrInvalidReport, r.GetRegion(), i, err)
		}
		msgs[i] = kafka.Message{Key: key, Value: v, Time: now, Headers: headers}
		lo = hi
	}
	return msgs, nil
}
