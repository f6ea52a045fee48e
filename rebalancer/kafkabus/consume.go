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
// counting them in Stats.SkippedParts: a part's consumer keeps its own
// part's messages (key "<region>/<part>") and those of senders without
// parts (key "<region>") without paying for the other parts' decoding.
func (b *Bus) RunKeys(ctx context.Context, keep func(key []byte) bool, deliver func(*quotientv1.UsageReport)) error {
	if deliver == nil {
		return fmt.Errorf("%w: deliver is nil", ErrConfig)
	}
	defer b.producer.keepWarm(ctx, b.cfg.WarmInterval)()
	asm := newAssembler(b.cfg.MaxPendingReports, maxDelivered)
	cc := consumeConfig(b.cluster, b.cfg.ConsumeTopics, b.cfg.TopicPollInterval, b.cfg.FetchWait, b.cfg.Lookback, b.cfg.MaxMessageBytes, b.cfg.Now, &b.stats.missingTopics)
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
