package policysync

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/proto"

	"github.com/quotientlabs/quotient/internal/kafkautil"
	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
	"github.com/quotientlabs/quotient/region/admin"
)

// Topic is the policy topic's name, fixed by the Terraform module.
const Topic = "quotient.policies"

// TopicSpec is the topic as EnsureTopics creates it where Terraform did not:
// compacted, one partition (one total order of versions).
func TopicSpec(replicationFactor int) kafkautil.TopicSpec {
	return kafkautil.CompactedTopic(Topic, 1, replicationFactor)
}

// Encode is r on the wire.
func Encode(r admin.Record) ([]byte, error) {
	return proto.Marshal(&quotientv1.PolicyRecord{
		Kind: string(r.Kind), Id: r.ID, Version: r.Version, Document: r.Document,
		Deleted: r.Deleted, Author: r.Author, UnixMs: r.UnixMs,
	})
}

// Decode parses a record from the wire (not its document: admin.Catalog
// does that).
func Decode(b []byte) (admin.Record, error) {
	var p quotientv1.PolicyRecord
	if err := proto.Unmarshal(b, &p); err != nil {
		return admin.Record{}, fmt.Errorf("policysync: decode: %w", err)
	}
	return admin.Record{Kind: admin.Kind(p.Kind), ID: p.Id, Version: p.Version, Document: p.Document,
		Deleted: p.Deleted, Author: p.Author, UnixMs: p.UnixMs}, nil
}

// KafkaLog appends records to the topic with acks=all. It implements
// admin.Log and is safe for concurrent use. It never creates the topic
// (EnsureTopics with TopicSpec, or Terraform, does).
type KafkaLog struct {
	p     *kafkautil.Producer
	topic string
}

var _ admin.Log = (*KafkaLog)(nil)

// NewKafkaLog returns a KafkaLog writing to topic (Topic in production) on
// cl. It does no I/O. The caller closes it.
func NewKafkaLog(cl *kafkautil.Cluster, topic string) (*KafkaLog, error) {
	wc := kafkautil.DefaultWriterConfig(topic)
	wc.BatchTimeout = time.Millisecond
	p, err := cl.NewProducer(wc, nil)
	if err != nil {
		return nil, fmt.Errorf("policysync: %w", err)
	}
	return &KafkaLog{p: p, topic: topic}, nil
}

// Prepare loads the topic's metadata and opens the connection to its
// leader (kafkautil.Producer.Prepare), so that the next Append costs one
// produce round trip instead of four (measured through a broker 400 ms
// away) inside the admin API's write deadline; call it at start-up against
// a far broker. Appends work without it. Calling it again keeps
// the connection from idling out (kafka-go closes it after 30 s unused).
// Safe for concurrent use; an error changes nothing for later calls.
func (l *KafkaLog) Prepare(ctx context.Context) error {
	if err := l.p.Prepare(ctx); err != nil {
		return fmt.Errorf("policysync: prepare the log %q: %w", l.topic, err)
	}
	return nil
}

// Append implements admin.Log: it returns once every in-sync replica has
// the record. A topic just created elsewhere and not yet in the metadata
// is retried (kafkautil.DefaultBackoff) within ctx.
func (l *KafkaLog) Append(ctx context.Context, r admin.Record) error {
	b, err := Encode(r)
	if err != nil {
		return err
	}
	if err := l.p.Write(ctx, kafka.Message{Key: []byte(r.Key()), Value: b}); err != nil {
		return fmt.Errorf("policysync: append %s: %w", r.Key(), err)
	}
	return nil
}

// Close flushes and closes the writer; Append fails (kafkautil.ErrClosed)
// after.
func (l *KafkaLog) Close() error { return l.p.Close() }

// Follower reads the topic from its first offset into a Catalog and calls
// OnChange after records changed it. Its fetches are held at the broker
// kafkautil.DefaultFetchWait (5 s), so a record appended reaches it about
// one round trip later from a broker up to 1 s away; it tells that it has
// caught up (Ready) by the end offsets taken when Run starts, never by an
// empty fetch, and stopping does not wait for the fetch held. Safe for
// concurrent use.
type Follower struct {
	cl       *kafkautil.Cluster
	topic    string
	cat      *admin.Catalog
	onChange func()
	logger   *slog.Logger
	ready    atomic.Bool
	records  atomic.Int64
	bad      atomic.Int64
}

// NewFollower returns a Follower of topic on cl feeding cat; onChange (may
// be nil) is called after every record that changed cat, from the
// Follower's goroutines, and must not block.
func NewFollower(cl *kafkautil.Cluster, topic string, cat *admin.Catalog, onChange func(), logger *slog.Logger) *Follower {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if onChange == nil {
		onChange = func() {}
	}
	return &Follower{cl: cl, topic: topic, cat: cat, onChange: onChange, logger: logger}
}

// Ready reports whether the Follower has read every record that was on the
// topic when Run started.
func (f *Follower) Ready() bool { return f.ready.Load() }

// Records is the number of records read; Bad those refused (undecodable or
// refused by the Catalog; they are logged and skipped).
func (f *Follower) Records() int64 { return f.records.Load() }

// Bad is the number of records refused.
func (f *Follower) Bad() int64 { return f.bad.Load() }

// Run reads until ctx ends or a partition cannot be read; it waits for the
// topic to exist. It returns ctx.Err() on cancellation. It reads through
// kafkautil.ConsumeTopics, so partitions added to the topic later are read
// too (found within 5 s), and a partition whose offset retention removed
// under its reader starts again at its first offset (the log is compacted:
// every policy's newest record is kept).
func (f *Follower) Run(ctx context.Context) error {
	var parts []int
	err := kafkautil.RetryUnknownTopic(ctx, kafkautil.DefaultBackoff(), func() error {
		var err error
		parts, err = f.cl.Partitions(ctx, f.topic)
		return err
	})
	if err != nil {
		return fmt.Errorf("policysync: partitions of %q: %w", f.topic, err)
	}
	// No record has a timestamp a century ahead: these are the end offsets.
	ends, err := f.cl.OffsetsAt(ctx, f.topic, parts, time.Now().AddDate(100, 0, 0))
	if err != nil {
		return fmt.Errorf("policysync: %w", err)
	}
	// Ready once every partition known now has been read up to its end
	// offset; catching up is told by those offsets, never by an empty fetch.
	behind := map[int]int64{}
	for _, p := range parts {
		if ends[p] > 0 {
			behind[p] = ends[p]
		}
	}
	if len(behind) == 0 {
		f.ready.Store(true)
	}
	// Fetches are held kafkautil's default (5 s), so that a change costs one
	// round trip to a broker up to 1 s away (a short wait makes kafka-go
	// give up on every idle fetch from a far broker); stopping does not wait
	// for the fetch in flight.
	err = kafkautil.ConsumeTopics(ctx, f.cl, kafkautil.ConsumeConfig{
		Topics: []string{f.topic},
		Restarted: func(topic string, partition int, offset int64) {
			f.logger.Warn("policysync: partition restarted at its first offset (its offset was removed by retention)",
				"topic", topic, "partition", partition, "offset", offset)
		},
	}, func(_ context.Context, _ string, p int, m kafka.Message) error {
		f.apply(p, m)
		if end, ok := behind[p]; ok && m.Offset+1 >= end {
			delete(behind, p)
			if len(behind) == 0 {
				f.ready.Store(true)
			}
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("policysync: read %q: %w", f.topic, err)
	}
	return err
}

// apply decodes one record of partition p into the Catalog, counting and
// logging a refused one.
func (f *Follower) apply(p int, m kafka.Message) {
	f.records.Add(1)
	rec, err := Decode(m.Value)
	changed := false
	if err == nil {
		changed, err = f.cat.Apply(rec)
	}
	if err != nil {
		f.bad.Add(1)
		f.logger.Warn("policysync: record skipped", "partition", p, "offset", m.Offset, "err", err)
	}
	if changed {
		f.onChange()
	}
}
