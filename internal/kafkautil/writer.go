package kafkautil

import (
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// WriterConfig tunes NewWriter. Start from DefaultWriterConfig.
type WriterConfig struct {
	// Topic every message goes to. Required.
	Topic string
	// BatchTimeout is how long the writer waits to fill a batch before
	// sending it. Default 5 ms.
	BatchTimeout time.Duration
	// BatchBytes bounds one produce batch to one partition, bytes
	// (uncompressed, as kafka-go estimates it), and therefore the largest
	// single message. Must not exceed the topic's max.message.bytes.
	// Default 1,000,000 (Kafka's default limit is 1,048,588).
	BatchBytes int64
	// BatchSize bounds the messages in one batch. Default 1000.
	BatchSize int
	// Compression codec. Default lz4 (cheap, a good fit for protobuf).
	Compression kafka.Compression
	// Balancer picks the partition from the message key. Default
	// kafka.Murmur2Balancer, the Java client's partitioner, so that other
	// tools writing the same keys agree on partitions.
	Balancer kafka.Balancer
	// MaxAttempts is how many times kafka-go tries a batch. Default 5.
	MaxAttempts int
	// WriteTimeout bounds one produce round trip. Default 10 s.
	WriteTimeout time.Duration
}

// DefaultWriterConfig returns the defaults for topic.
func DefaultWriterConfig(topic string) WriterConfig {
	return WriterConfig{
		Topic:        topic,
		BatchTimeout: 5 * time.Millisecond,
		BatchBytes:   1_000_000,
		BatchSize:    1000,
		Compression:  kafka.Lz4,
		Balancer:     kafka.Murmur2Balancer{},
		MaxAttempts:  5,
		WriteTimeout: 10 * time.Second,
	}
}

// NewWriter returns a synchronous kafka-go Writer for wc.Topic with
// RequiredAcks = all, sharing c's Transport (so topics created by
// EnsureTopics are known to it at once). Zero fields of wc take the
// defaults. WriteMessages blocks until every message is acknowledged by all
// in-sync replicas or fails. The caller owns the Writer and must Close it.
func (c *Cluster) NewWriter(wc WriterConfig) (*kafka.Writer, error) {
	d := DefaultWriterConfig(wc.Topic)
	if wc.Topic == "" {
		return nil, fmt.Errorf("%w: writer topic is empty", ErrConfig)
	}
	if wc.BatchTimeout < 0 || wc.BatchBytes < 0 || wc.BatchSize < 0 || wc.MaxAttempts < 0 || wc.WriteTimeout < 0 {
		return nil, fmt.Errorf("%w: writer for %q: negative batch timeout, batch bytes, batch size, attempts or write timeout", ErrConfig, wc.Topic)
	}
	if wc.BatchTimeout == 0 {
		wc.BatchTimeout = d.BatchTimeout
	}
	if wc.BatchBytes == 0 {
		wc.BatchBytes = d.BatchBytes
	}
	if wc.BatchSize == 0 {
		wc.BatchSize = d.BatchSize
	}
	if wc.Compression == 0 {
		wc.Compression = d.Compression
	}
	if wc.Balancer == nil {
		wc.Balancer = d.Balancer
	}
	if wc.MaxAttempts == 0 {
		wc.MaxAttempts = d.MaxAttempts
	}
	if wc.WriteTimeout == 0 {
		wc.WriteTimeout = d.WriteTimeout
	}
	return &kafka.Writer{
		Addr:                   kafka.TCP(c.cfg.Brokers...),
		Topic:                  wc.Topic,
		Balancer:               wc.Balancer,
		MaxAttempts:            wc.MaxAttempts,
		WriteBackoffMin:        20 * time.Millisecond,
		WriteBackoffMax:        time.Second,
		BatchSize:              wc.BatchSize,
		BatchBytes:             wc.BatchBytes,
		BatchTimeout:           wc.BatchTimeout,
		ReadTimeout:            wc.WriteTimeout,
		WriteTimeout:           wc.WriteTimeout,
		RequiredAcks:           kafka.RequireAll,
		Compression:            wc.Compression,
		Transport:              c.transport,
		AllowAutoTopicCreation: false,
	}, nil
}
