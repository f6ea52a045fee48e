package kafkabus

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

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
// splitting); while deliver runs, reading stalls
// (backpressure), so it should return quickly. Partitions start at the
// first record at or after now - Config.Lookback (see the package doc).
//
// Run blocks until ctx ends, then stops its readers and returns ctx.Err(),
// or until reading fails for a reason other than the context, then returns
// that error (wrapped) after stopping everything; the caller may call Run
// again, which re-reads the lookback window. Topics that do not exist are
// waited for, not an error. Malformed messages are counted and skipped.
func (b *Bus) Run(ctx context.Context, deliver func(*quotientv1.UsageReport)) error {
	if deliver == nil {
		return fmt.Errorf("%w: deliver is nil", ErrConfig)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	parts := make(chan *quotientv1.UsageReport, 64)
	errc := make(chan error, len(b.cfg.ConsumeTopics))
	var wg sync.WaitGroup
	for _, topic := range b.cfg.ConsumeTopics {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.watchTopic(ctx, topic, parts); err != nil && ctx.Err() == nil {
				errc <- err
			}
		}()
	}
	defer wg.Wait() // after cancel (deferred later, runs first)
	defer cancel()

	asm := newAssembler(b.cfg.MaxPendingReports, maxDelivered)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errc:
			return err
		case p := <-parts:
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
		}
	}
}

// watchTopic waits for topic to exist, starts a reader per partition, and
// keeps checking for added partitions until ctx ends or a reader fails.
func (b *Bus) watchTopic(ctx context.Context, topic string, out chan<- *quotientv1.UsageReport) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	errc := make(chan error, 1)
	started := map[int]bool{}
	missing := false
	defer func() {
		if missing {
			b.stats.missingTopics.Add(-1)
		}
	}()
	wait := 50 * time.Millisecond
	for {
		ids, err := b.cluster.Partitions(ctx, topic)
		switch {
		case kafkautil.IsUnknownTopic(err):
			if !missing {
				missing = true
				b.stats.missingTopics.Add(1)
			}
		case err != nil:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// A failed metadata request is retried like a missing topic:
			// the cluster may be briefly unreachable.
		default:
			if missing {
				missing = false
				b.stats.missingTopics.Add(-1)
			}
			var fresh []int
			for _, id := range ids {
				if !started[id] {
					fresh = append(fresh, id)
				}
			}
			if len(fresh) > 0 {
				offsets, err := b.cluster.OffsetsAt(ctx, topic, fresh, b.cfg.Now().Add(-b.cfg.Lookback))
				if err != nil {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					break // try again at the next check
				}
				for _, id := range fresh {
					started[id] = true
					wg.Add(1)
					go func() {
						defer wg.Done()
						if err := b.readPartition(ctx, topic, id, offsets[id], out); err != nil && ctx.Err() == nil {
							select {
							case errc <- err:
							default:
							}
							cancel()
						}
					}()
				}
			}
			wait = b.cfg.TopicPollInterval
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			select {
			case err := <-errc:
				return err
			default:
				return ctx.Err()
			}
		case <-t.C:
		}
		wait = min(2*wait, b.cfg.TopicPollInterval)
	}
}

// readPartition reads one partition from offset, decodes each message and
// sends it to out. An offset that retention removed under it restarts the
// reader at the lookback time.
func (b *Bus) readPartition(ctx context.Context, topic string, partition int, offset int64, out chan<- *quotientv1.UsageReport) error {
	r, err := b.cluster.NewPartitionReader(topic, partition, offset, kafkautil.ReaderConfig{
		MaxBytes: 4 * b.cfg.MaxMessageBytes,
	})
	if err != nil {
		return fmt.Errorf("kafkabus: %w", err)
	}
	defer func() { _ = r.Close() }()
	for {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, kafka.OffsetOutOfRange) {
				offsets, oerr := b.cluster.OffsetsAt(ctx, topic, []int{partition}, b.cfg.Now().Add(-b.cfg.Lookback))
				if oerr == nil {
					if serr := r.SetOffset(offsets[partition]); serr == nil {
						continue
					}
				}
			}
			return fmt.Errorf("kafkabus: read %q partition %d: %w", topic, partition, err)
		}
		b.stats.consumedParts.Add(1)
		p := &quotientv1.UsageReport{}
		if err := proto.Unmarshal(m.Value, p); err != nil {
			b.stats.malformed.Add(1)
			continue
		}
		select {
		case out <- p:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
