package kafkabus

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/quotientlabs/quotient/internal/kafkautil"
)

// busProducer is the producing side Bus and TransferBus share: one
// kafkautil.Producer on the bus's topic, its Prepare (failures counted)
// and the loop that keeps it ready. Safe for concurrent use.
type busProducer struct {
	topic         string
	p             *kafkautil.Producer
	prepareErrors atomic.Int64
}

// newBusProducer returns the producer of topic, placing messages with
// partBalancer (KeyPartHeader, else the key's hash), writing batches of up
// to maxMessageBytes, each held up to batchTimeout (<= 0: kafkautil's
// default), and creating the topic as create says (nil: never). It does
// no I/O; an error is the cluster's, unwrapped.
func newBusProducer(cluster *kafkautil.Cluster, topic string, maxMessageBytes int, batchTimeout time.Duration, create *kafkautil.TopicSpec) (*busProducer, error) {
	wc := kafkautil.DefaultWriterConfig(topic)
	// Reports of a key part go to their part's partition; everything else
	// (reports without parts, transfers) by key hash, as before.
	wc.Balancer = partBalancer{fallback: wc.Balancer}
	wc.BatchBytes = int64(maxMessageBytes)
	if batchTimeout > 0 {
		wc.BatchTimeout = batchTimeout
	}
	p, err := cluster.NewProducer(wc, create)
	if err != nil {
		return nil, err
	}
	return &busProducer{topic: topic, p: p}, nil
}

// busTopicSpec is the topic a bus creates: cleanup.policy=delete,
// retention as given, max.message.bytes above maxMessageBytes (a record's
// overhead).
func busTopicSpec(topic string, partitions, replicationFactor int, retention time.Duration, maxMessageBytes int) kafkautil.TopicSpec {
	spec := kafkautil.RetainedTopic(topic, partitions, replicationFactor, retention)
	spec.Config["max.message.bytes"] = fmt.Sprint(maxMessageBytes + 4096)
	return spec
}

// prepare is Bus.Prepare and TransferBus.Prepare: ErrClosed after close,
// else the producer's error wrapped with the topic; every failure counts
// in prepareErrors.
func (b *busProducer) prepare(ctx context.Context) error {
	if err := b.p.Prepare(ctx); err != nil {
		b.prepareErrors.Add(1)
		if errors.Is(err, kafkautil.ErrClosed) {
			return ErrClosed
		}
		return fmt.Errorf("kafkabus: prepare the producer of %q: %w", b.topic, err)
	}
	return nil
}

// keepWarm calls prepare at once and every interval, from a goroutine of
// its own, until ctx ends or stop is called; stop returns once that
// goroutine has ended. A Run calls it at start and stop on its way out.
func (b *busProducer) keepWarm(ctx context.Context, every time.Duration) (stop func()) {
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			_ = b.prepare(wctx) // counted; publications report their own failures
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// consumeConfig says what a bus's Run reads: every partition of every
// topic from lookback before now, read ahead by up to 64 messages of up
// to maxMessageBytes, each fetch held open up to fetchWait, the topic list
// polled every poll; missing counts the topics waited for now.
func consumeConfig(cluster *kafkautil.Cluster, topics []string, poll, fetchWait, lookback time.Duration, maxMessageBytes int, now func() time.Time, missing *atomic.Int64) kafkautil.ConsumeConfig {
	return kafkautil.ConsumeConfig{
		Topics:       topics,
		PollInterval: poll,
		Buffer:       64,
		Reader:       kafkautil.ReaderConfig{MaxBytes: 4 * maxMessageBytes, MaxWait: fetchWait},
		StartOffsets: cluster.StartAt(func() time.Time { return now().Add(-lookback) }),
		Missing: func(_ string, m bool) {
			if m {
				missing.Add(1)
			} else {
				missing.Add(-1)
			}
		},
	}
}
