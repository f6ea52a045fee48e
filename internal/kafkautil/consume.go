package kafkautil

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"golang.org/x/sync/errgroup"
)

// minTopicWait is the first wait before looking again for a missing topic.
const minTopicWait = 50 * time.Millisecond

// ConsumeConfig says what ConsumeTopics reads and from where. Topics is
// required; every other zero field takes its default.
type ConsumeConfig struct {
	// Topics are read, every partition of each unless Select says
	// otherwise. Required: at least one, each non-empty, no name twice.
	Topics []string
	// Select, if not nil, says which partitions of topic are read, given
	// the topic's partition count (partitions >= 1; a topic's partitions
	// are 0 .. partitions-1). It is called at every check that finds the
	// topic (ConsumeConfig.PollInterval), so partitions added later go
	// through it too; ids outside [0, partitions) and repeats are ignored,
	// and an empty result reads nothing of topic (for now). A partition
	// once read stays read until ConsumeTopics returns, even if a later
	// call no longer selects it (readers are never stopped one by one). It
	// may be called concurrently for different topics and must not block.
	// Default nil: every partition.
	Select func(topic string, partitions int) []int
	// PollInterval is how often ConsumeTopics looks again for partitions
	// added to known topics; while a topic is missing (or metadata requests
	// fail) it looks sooner, from 50 ms doubling up to PollInterval.
	// Default 5 s.
	PollInterval time.Duration
	// Buffer is how many messages the readers may read ahead of handle, over
	// all partitions. Default 64.
	Buffer int
	// Reader tunes every partition reader; its defaults and limits are
	// ReaderConfig's (fetches held DefaultFetchWait, at least
	// MinFetchWait).
	Reader ReaderConfig
	// StartOffsets returns the offset each given partition of topic starts
	// at (kafka.FirstOffset and kafka.LastOffset are allowed), with an entry
	// for every partition. It is called with the partitions found in one
	// check, and with one partition whose offset retention removed under
	// its reader (kafka.OffsetOutOfRange). On error, found partitions are
	// tried again at the next check, and a reader that lost its offset fails
	// with its read error. It may be called concurrently. Default
	// FirstOffsets.
	StartOffsets func(ctx context.Context, topic string, partitions []int) (map[int]int64, error)
	// Restarted, if not nil, is called after a reader whose offset was out
	// of range moved to the offset StartOffsets gave. It may be called
	// concurrently from different readers and must not block.
	Restarted func(topic string, partition int, offset int64)
	// Missing, if not nil, is called with true when a topic turns out unknown
	// to the cluster, and with false when it then appears or when
	// ConsumeTopics returns while it is missing (so a count kept from these
	// calls returns to zero). It may be called concurrently for different
	// topics and must not block.
	Missing func(topic string, missing bool)
}

// FirstOffsets starts every partition at its first offset. It is the
// default ConsumeConfig.StartOffsets and never fails.
func FirstOffsets(_ context.Context, _ string, partitions []int) (map[int]int64, error) {
	out := make(map[int]int64, len(partitions))
	for _, p := range partitions {
		out[p] = kafka.FirstOffset
	}
	return out, nil
}

// StartAt returns a ConsumeConfig.StartOffsets that starts each partition
// at its first record whose timestamp is at or after at() (see
// Cluster.OffsetsAt), with at read on every call.
func (c *Cluster) StartAt(at func() time.Time) func(ctx context.Context, topic string, partitions []int) (map[int]int64, error) {
	return func(ctx context.Context, topic string, partitions []int) (map[int]int64, error) {
		return c.OffsetsAt(ctx, topic, partitions, at())
	}
}

func (cc *ConsumeConfig) validate() error {
	if len(cc.Topics) == 0 {
		return fmt.Errorf("%w: consume topics: at least one is required", ErrConfig)
	}
	if err := checkTopics(cc.Topics, ErrConfig); err != nil {
		return err
	}
	if cc.PollInterval < 0 {
		return fmt.Errorf("%w: poll interval %v: must not be negative", ErrConfig, cc.PollInterval)
	}
	if cc.PollInterval == 0 {
		cc.PollInterval = 5 * time.Second
	}
	if cc.Buffer < 0 {
		return fmt.Errorf("%w: buffer %d: must not be negative", ErrConfig, cc.Buffer)
	}
	if cc.Buffer == 0 {
		cc.Buffer = 64
	}
	if cc.StartOffsets == nil {
		cc.StartOffsets = FirstOffsets
	}
	return cc.Reader.check()
}

// checkTopics rejects an empty or repeated topic name, wrapping errConfig.
func checkTopics(topics []string, errConfig error) error {
	seen := make(map[string]bool, len(topics))
	for i, t := range topics {
		if t == "" {
			return fmt.Errorf("%w: consume topics[%d] is empty", errConfig, i)
		}
		if seen[t] {
			return fmt.Errorf("%w: consume topics: %q listed twice", errConfig, t)
		}
		seen[t] = true
	}
	return nil
}

// record is one message on its way from a reader to handle.
type record struct {
	topic     string
	partition int
	m         kafka.Message
}

// consumer is the state of one ConsumeTopics call.
type consumer struct {
	c    *Cluster
	cfg  ConsumeConfig
	g    *errgroup.Group
	recs chan record
}

// ConsumeTopics reads every partition of every cfg.Topics topic (those
// cfg.Select chooses, when set), without a consumer group or committed
// offsets, and calls handle with each message, from the calling goroutine,
// one call at a time: in offset order within a partition, in arrival order
// across partitions. handle gets a context
// that ends when ConsumeTopics stops; while it runs, reading stalls once
// cfg.Buffer messages wait (backpressure), so it should return quickly.
//
// Partitions start at cfg.StartOffsets, taken when a check finds them. A
// topic the cluster does not know yet is waited for, and partitions added
// later are found, both by polling (cfg.PollInterval); neither is an error.
// Each partition has a reader goroutine, and each topic a watcher.
//
// ConsumeTopics blocks until ctx ends, then stops every goroutine it started
// and returns ctx.Err(); or until a reader fails (its error, naming topic
// and partition) or handle returns an error (that error, as is), then stops
// everything and returns the first such error. A bad cfg, nil c or nil
// handle is an error wrapping ErrConfig, before any I/O. Safe to call
// concurrently; each call reads on its own.
func ConsumeTopics(ctx context.Context, c *Cluster, cfg ConsumeConfig, handle func(ctx context.Context, topic string, partition int, m kafka.Message) error) error {
	switch {
	case c == nil:
		return fmt.Errorf("%w: cluster is nil", ErrConfig)
	case handle == nil:
		return fmt.Errorf("%w: handle is nil", ErrConfig)
	}
	cfg.Topics = append([]string(nil), cfg.Topics...)
	if err := cfg.validate(); err != nil {
		return err
	}
	stopCtx, stop := context.WithCancel(ctx)
	defer stop()
	g, gctx := errgroup.WithContext(stopCtx)
	cs := &consumer{c: c, cfg: cfg, g: g, recs: make(chan record, cfg.Buffer)}
	for _, topic := range cfg.Topics {
		g.Go(func() error { return cs.watch(gctx, topic) })
	}
	done := make(chan error, 1)
	go func() { done <- g.Wait() }()
	for {
		select {
		case err := <-done:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		case r := <-cs.recs:
			if err := handle(gctx, r.topic, r.partition, r.m); err != nil {
				stop()
				<-done
				return err
			}
		}
	}
}

// watch waits for topic to exist, starts a reader per partition, and keeps
// looking for added partitions until ctx ends.
func (cs *consumer) watch(ctx context.Context, topic string) error {
	missing := false
	setMissing := func(m bool) {
		if m != missing && cs.cfg.Missing != nil {
			cs.cfg.Missing(topic, m)
		}
		missing = m
	}
	defer setMissing(false)
	started := map[int]bool{}
	poll := cs.cfg.PollInterval
	wait := min(minTopicWait, poll)
	for {
		ids, err := cs.c.Partitions(ctx, topic)
		switch {
		case IsUnknownTopic(err):
			setMissing(true)
		case err != nil:
			// A failed metadata request is retried like a missing topic: the
			// cluster may be briefly unreachable.
		default:
			setMissing(false)
			if cs.cfg.Select != nil {
				ids = selected(ids, cs.cfg.Select(topic, len(ids)))
			}
			if cs.start(ctx, topic, ids, started) {
				wait = poll
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, poll)
	}
}

// selected returns the ids of ids (sorted) that sel names, in order, once
// each.
func selected(ids, sel []int) []int {
	keep := make(map[int]bool, len(sel))
	for _, id := range sel {
		keep[id] = true
	}
	out := ids[:0:0]
	for _, id := range ids {
		if keep[id] {
			out = append(out, id)
		}
	}
	return out
}

// start starts a reader for each partition of ids not in started, and
// reports whether all of them (if any) could be started.
func (cs *consumer) start(ctx context.Context, topic string, ids []int, started map[int]bool) bool {
	var fresh []int
	for _, id := range ids {
		if !started[id] {
			fresh = append(fresh, id)
		}
	}
	if len(fresh) == 0 {
		return true
	}
	offsets, err := cs.cfg.StartOffsets(ctx, topic, fresh)
	if err != nil {
		return false
	}
	for _, id := range fresh {
		if _, ok := offsets[id]; !ok {
			return false
		}
	}
	for _, id := range fresh {
		started[id] = true
		cs.g.Go(func() error { return cs.read(ctx, topic, id, offsets[id]) })
	}
	return true
}

// read reads one partition from offset and hands each message on. An
// offset that retention removed restarts the reader at StartOffsets. When
// ctx ends, the reader's connections are closed first, so that closing it
// does not wait for a fetch the broker holds open.
func (cs *consumer) read(ctx context.Context, topic string, partition int, offset int64) error {
	conns := &readerConns{}
	r, err := cs.c.newPartitionReader(topic, partition, offset, cs.cfg.Reader, conns.dialer(cs.c.dialer))
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, conns.closeAll)
	defer func() {
		stop()
		conns.closeAll()
		_ = r.Close()
	}()
	for {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, kafka.OffsetOutOfRange) && cs.restart(ctx, r, topic, partition) {
				continue
			}
			return fmt.Errorf("kafkautil: read %q partition %d: %w", topic, partition, err)
		}
		select {
		case cs.recs <- record{topic: topic, partition: partition, m: m}:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// restart moves r to the partition's start offset and reports whether it
// could.
func (cs *consumer) restart(ctx context.Context, r *kafka.Reader, topic string, partition int) bool {
	offsets, err := cs.cfg.StartOffsets(ctx, topic, []int{partition})
	if err != nil {
		return false
	}
	off, ok := offsets[partition]
	if !ok || r.SetOffset(off) != nil {
		return false
	}
	if cs.cfg.Restarted != nil {
		cs.cfg.Restarted(topic, partition, off)
	}
	return true
}
