package kafkabus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/proto"

	"github.com/quotientlabs/quotient/internal/kafkautil"
	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
)

// ErrHistoryUnknown: Published cannot prove that no report of the region
// was published since the time asked (records that may be of the span
// were removed by retention); the caller must assume one was.
var ErrHistoryUnknown = errors.New("kafkabus: report history unknown")

// Published reports whether a part of a report of region is in a record of
// one of Config.ConsumeTopics timestamped at or after since: the driver's
// first-start check (rebalancer.ReportHistory, rebalancer.DriverConfig.History).
// It reads, on its own readers (Run need not be running), every partition
// from the first record at or after since to the partition's end as read
// when the call began, and returns true at the first such part.
//
// A topic that does not exist (not created yet) and an empty partition
// that never lost a record hold no report. A partition whose first
// retained record is at or after since, while retention removed older
// ones, may have lost records of the span: Published then returns an error
// wrapping ErrHistoryUnknown (a fleet that was down for longer than the
// topic's retention warms up once). Any read failure, and ctx ending, is
// an error too. It blocks until done; safe for concurrent use.
func (b *Bus) Published(ctx context.Context, region string, since time.Time) (bool, error) {
	for _, topic := range b.cfg.ConsumeTopics {
		found, err := b.published(ctx, topic, region, since)
		if err != nil || found {
			return found, err
		}
	}
	return false, nil
}

func (b *Bus) published(ctx context.Context, topic, region string, since time.Time) (bool, error) {
	parts, err := b.cluster.Partitions(ctx, topic)
	if errors.Is(err, kafkautil.ErrUnknownTopic) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	// The log start offsets first: a record removed after this read was
	// older than the ones the offsets below find.
	starts := make([]kafka.OffsetRequest, len(parts))
	for i, p := range parts {
		starts[i] = kafka.FirstOffsetOf(p)
	}
	resp, err := b.cluster.Client().ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: starts}})
	if err != nil {
		return false, fmt.Errorf("kafkabus: first offsets of %q: %w", topic, err)
	}
	first := make(map[int]int64, len(parts))
	for _, po := range resp.Topics[topic] {
		if po.Error != nil {
			return false, fmt.Errorf("kafkabus: first offset of %q partition %d: %w", topic, po.Partition, po.Error)
		}
		first[po.Partition] = po.FirstOffset
	}
	ends, err := b.cluster.OffsetsAt(ctx, topic, parts, time.Unix(0, 1<<62)) // no record so late: every end offset
	if err != nil {
		return false, err
	}
	from, err := b.cluster.OffsetsAt(ctx, topic, parts, since)
	if err != nil {
		return false, err
	}
	for _, p := range parts {
		start, ok := first[p]
		if !ok {
			return false, fmt.Errorf("kafkabus: no first offset for %q partition %d in the broker's answer", topic, p)
		}
		if from[p] <= start && start > 0 {
			return false, fmt.Errorf("%w: %q partition %d: retention removed records before offset %d, the first at or after %s", ErrHistoryUnknown, topic, p, start, since.UTC().Format(time.RFC3339))
		}
		found, err := b.scan(ctx, topic, p, from[p], ends[p], region)
		if err != nil || found {
			return found, err
		}
	}
	return false, nil
}

// scan reads partition p of topic from offset from up to (not including)
// end, and reports whether a part of a report of region is among them.
func (b *Bus) scan(ctx context.Context, topic string, p int, from, end int64, region string) (bool, error) {
	if from >= end {
		return false, nil
	}
	r, err := b.cluster.NewPartitionReader(topic, p, from, kafkautil.ReaderConfig{MaxBytes: 4 * b.cfg.MaxMessageBytes, MaxWait: b.cfg.FetchWait})
	if err != nil {
		return false, err
	}
	defer r.Close()
	for {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			return false, fmt.Errorf("kafkabus: read %q partition %d at offset %d: %w", topic, p, from, err)
		}
		rep := &quotientv1.UsageReport{}
		if proto.Unmarshal(m.Value, rep) == nil && rep.GetRegion() == region {
			return true, nil
		}
		if m.Offset+1 >= end {
			return false, nil
		}
	}
}
