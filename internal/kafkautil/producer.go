package kafkautil

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/segmentio/kafka-go"
)

// ErrClosed is returned by Producer.Write after Close.
var ErrClosed = errors.New("kafkautil: producer closed")

// Producer writes a bus's records to its one topic, creating the topic
// before the first write when asked to. Construct with Cluster.NewProducer.
// Safe for concurrent use; Write blocks until its records are acknowledged
// or fail.
type Producer struct {
	cluster *Cluster
	writer  *kafka.Writer
	create  *TopicSpec // nil: never create the topic

	mu      sync.Mutex
	created bool
	closed  bool
}

// NewProducer returns a Producer writing with a Writer built from wc (see
// NewWriter). create, when not nil, is the topic EnsureTopics creates before
// the first write (its Name should be wc.Topic); nil means the topic is
// managed elsewhere. It does no I/O.
func (c *Cluster) NewProducer(wc WriterConfig, create *TopicSpec) (*Producer, error) {
	if create != nil {
		if err := create.validate(); err != nil {
			return nil, err
		}
	}
	w, err := c.NewWriter(wc)
	if err != nil {
		return nil, err
	}
	return &Producer{cluster: c, writer: w, create: create}, nil
}

// Write creates the topic if this is the first successful Write of a
// Producer that creates it, then writes msgs and blocks until all are
// acknowledged by every in-sync replica, retrying an unknown topic (just
// created, or created elsewhere) with DefaultBackoff. It returns ErrClosed
// after Close, and otherwise the creation or write error; some of msgs may
// have been written when it fails. Concurrent first Writes wait for one
// topic creation.
func (p *Producer) Write(ctx context.Context, msgs ...kafka.Message) error {
	if err := p.ensureTopic(ctx); err != nil {
		return err
	}
	return RetryUnknownTopic(ctx, DefaultBackoff(), func() error {
		return p.writer.WriteMessages(ctx, msgs...)
	})
}

// Prepare does before the first Write what that Write would otherwise do
// inside its own deadline, so that the Write costs one produce round trip:
// it creates the topic (when the Producer creates it), waits until the
// shared metadata cache knows the topic (retrying an unknown topic like
// Write), and asks the leader of each of its partitions for its end offset,
// which opens the connection to each leader that produce requests then use
// (the Writer shares the Cluster's Transport). Writes work without it.
// Calling it again keeps those connections from idling out (kafka-go closes
// them after 30 s without a request). Safe for concurrent use, with Write
// too. It returns ErrClosed after Close, otherwise the first failure, which
// changes nothing for later calls or Writes.
func (p *Producer) Prepare(ctx context.Context) error {
	if err := p.ensureTopic(ctx); err != nil {
		return err
	}
	topic := p.writer.Topic
	return RetryUnknownTopic(ctx, DefaultBackoff(), func() error {
		ids, err := p.cluster.Partitions(ctx, topic)
		if err != nil {
			return err
		}
		reqs := make([]kafka.OffsetRequest, len(ids))
		for i, id := range ids {
			reqs[i] = kafka.LastOffsetOf(id)
		}
		resp, err := p.cluster.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
		if err != nil {
			return fmt.Errorf("kafkautil: end offsets of %q: %w", topic, err)
		}
		for _, po := range resp.Topics[topic] {
			if po.Error != nil {
				return fmt.Errorf("kafkautil: end offset of %q partition %d: %w", topic, po.Partition, po.Error)
			}
		}
		return nil
	})
}

func (p *Producer) ensureTopic(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	if p.created || p.create == nil {
		return nil
	}
	if err := p.cluster.EnsureTopics(ctx, *p.create); err != nil {
		return err
	}
	p.created = true
	return nil
}

// Close flushes and closes the writer; Write fails with ErrClosed
// afterwards. Closing again does nothing and returns nil.
func (p *Producer) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	if err := p.writer.Close(); err != nil {
		return fmt.Errorf("kafkautil: close writer of %q: %w", p.writer.Topic, err)
	}
	return nil
}
