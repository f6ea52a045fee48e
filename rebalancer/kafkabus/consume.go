package kafkabus

import (
	"context"
	"fmt"

	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/proto"

	"github.com/quotientlabs/quotient/internal/kafkautil"
	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
)

// maxDelivered is how many delivered report IDs Run remembers per region
// to drop duplicates: at one report per epoch, far more than a lookback.
const maxDelivered = 256

// Run reads every partition of every Config.ConsumeTopics topic and calls
// deliver with each whole report, from Run's own goroutine, one call at a
// time, in arrival order (per region in publish order). deliver owns the
// report it is given and may keep it; a delivered report has all its keys,
// in the order they were published, and part = parts = 0 (whole, as before
// splitting); while deliver runs, reading stalls (backpressure), so it
// should return quickly. Partitions start at the first record at or after
// now - Config.Lookback (see the package doc); the reading, topic polling
// and partition discovery are kafkautil.ConsumeTopics.
//
// Run also keeps the producer ready: it calls Prepare at start and every
// Config.WarmInterval (failures are counted in Stats.PrepareErrors and
// tried again at the next interval), so that a Publish costs one produce
// round trip, not the topic creation, metadata and connection set-up
// inside the caller's deadline.
//
// Run blocks until ctx ends, then stops its readers and returns ctx.Err(),
// or until reading fails for a reason other than the context, then returns
// that error (wrapped) after stopping everything; the caller may call Run
// again, which re-reads the lookback window. Topics that do not exist are
// waited for, not an error. Malformed messages are counted and skipped.
func (b *Bus) Run(ctx context.Context, deliver func(*quotientv1.UsageReport)) error {
	return b.RunKeys(ctx, nil, deliver)
}

// RunKeys is Run that decodes only the messages whose Kafka key keep
// accepts (nil: every message), skipping the others undecoded and
// counting them in Stats.SkippedParts.
func (b *Bus) RunKeys(ctx context.Context, keep func(key []byte) bool, deliver func(*quotientv1.UsageReport)) error {
	return b.run(ctx, nil, keep, deliver)
}

// RunPart is Run for the consumer of key part part of a coordinator that
// splits the key space into parts parts (1 <= parts <= 4096, 0 <= part <
// parts; parts 1 is Run). Of each consumed topic, with n partitions, it
// reads only partition PartitionOf(part, n), where Publish places part's
// reports, and the partitions no part's reports are placed on (q >= parts
// with q mod parts == part, when n > parts), so that the consumers of all
// parts together read every partition: a report of a sender without
// parts, placed by its key's hash, reaches one of them and is refused
// (ErrPartsMismatch in Adapter.Run). Partitions added later are chosen by
// the same rule (kafkautil.ConsumeConfig.Select); a partition once read
// stays read. Of what it reads, it decodes only the messages of its own
// part (key "<region>/<part>"), of senders without parts (key "<region>")
// and of senders with more parts, skipping the other parts' undecoded
// (Stats.SkippedParts): several parts share a partition when the topic has
// fewer partitions than there are parts. A replica running k of the parts
// thus fetches about k/parts of the topic, not k times all of it. Bad
// part numbers are an error wrapping ErrConfig, before any I/O.
func (b *Bus) RunPart(ctx context.Context, part, parts int, deliver func(*quotientv1.UsageReport)) error {
	if parts < 1 || parts > maxKeyParts || part < 0 || part >= parts {
		return fmt.Errorf("%w: run part %d of %d, want 0 <= part < parts <= %d", ErrConfig, part, parts, maxKeyParts)
	}
	if parts == 1 {
		return b.Run(ctx, deliver)
	}
	sel := func(_ string, partitions int) []int { return partPartitions(part, parts, partitions) }
	return b.run(ctx, sel, partKeyFilter(part, parts), deliver)
}

// run is Run reading the partitions sel chooses of each topic (nil: all)
// and decoding the messages whose key keep accepts (nil: all).
func (b *Bus) run(ctx context.Context, sel func(topic string, partitions int) []int, keep func(key []byte) bool, deliver func(*quotientv1.UsageReport)) error {
	if deliver == nil {
		return fmt.Errorf("%w: deliver is nil", ErrConfig)
	}
	defer b.producer.keepWarm(ctx, b.cfg.WarmInterval)()
	asm := newAssembler(b.cfg.MaxPendingReports, maxDelivered)
	cc := consumeConfig(b.cluster, b.cfg.ConsumeTopics, b.cfg.TopicPollInterval, b.cfg.FetchWait, b.cfg.Lookback, b.cfg.MaxMessageBytes, b.cfg.Now, &b.stats.missingTopics)
	cc.Select = sel
	err := kafkautil.ConsumeTopics(ctx, b.cluster, cc, func(_ context.Context, _ string, _ int, m kafka.Message) error {
		b.stats.consumedParts.Add(1)
		if keep != nil && !keep(m.Key) {
			b.stats.skippedParts.Add(1)
			return nil
		}
		p := &quotientv1.UsageReport{}
		if err := proto.Unmarshal(m.Value, p); err != nil {
			b.stats.malformed.Add(1)
			return nil
		}
		whole, res, evicted, err := asm.add(p)
		b.stats.evicted.Add(int64(evicted))
		switch {
		case err != nil:
			b.stats.malformed.Add(1)
		case res == partDuplicate:
			b.stats.duplicates.Add(1)
		case res == partCompleted:
			b.stats.deliveredReports.Add(1)
			deliver(whole)
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("kafkabus: %w", err)
	}
	return err
}
