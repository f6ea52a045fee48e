package kafkautil

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// Backoff is a bounded exponential backoff.
type Backoff struct {
	// Min is the first wait. Default 50 ms.
	Min time.Duration
	// Max caps each wait. Default 1 s.
	Max time.Duration
	// Total bounds the time spent waiting over all attempts; when the next
	// wait would exceed it, the last error is returned. Default 10 s, longer
	// than kafka-go's default 6 s metadata TTL.
	Total time.Duration
}

// DefaultBackoff returns 50 ms doubling to 1 s, at most 10 s in total.
func DefaultBackoff() Backoff {
	return Backoff{Min: 50 * time.Millisecond, Max: time.Second, Total: 10 * time.Second}
}

// IsUnknownTopic reports whether err says the topic or partition is unknown
// to the cluster (Kafka's UNKNOWN_TOPIC_OR_PARTITION, or ErrUnknownTopic).
func IsUnknownTopic(err error) bool {
	return errors.Is(err, ErrUnknownTopic) || errors.Is(err, kafka.UnknownTopicOrPartition)
}

// RetryUnknownTopic calls fn until it returns nil or an error that is not an
// unknown-topic error, waiting b between attempts. It gives up with fn's last
// error when b.Total is spent, and with the context's error (wrapping fn's
// last error) when ctx ends. It blocks only in those waits.
func RetryUnknownTopic(ctx context.Context, b Backoff, fn func() error) error {
	d := DefaultBackoff()
	if b.Min <= 0 {
		b.Min = d.Min
	}
	if b.Max < b.Min {
		b.Max = max(d.Max, b.Min)
	}
	if b.Total <= 0 {
		b.Total = d.Total
	}
	wait, spent := b.Min, time.Duration(0)
	for {
		err := fn()
		if err == nil || !IsUnknownTopic(err) {
			return err
		}
		if spent+wait > b.Total {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("kafkautil: gave up waiting for topic: %w (last error: %w)", ctx.Err(), err)
		case <-t.C:
		}
		spent += wait
		wait = min(2*wait, b.Max)
	}
}
