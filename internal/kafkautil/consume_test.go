package kafkautil_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/kafkautil"
)

// deadline bounds every wait in the consumer tests.
const deadline = 30 * time.Second

// produce writes values to one partition of topic, acknowledged by all
// in-sync replicas.
func produce(t *testing.T, cl *kafkautil.Cluster, topic string, partition int, values ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	recs := make([]kafka.Record, len(values))
	for i, v := range values {
		recs[i] = kafka.Record{Value: kafka.NewBytes([]byte(v))}
	}
	resp, err := cl.Client().Produce(ctx, &kafka.ProduceRequest{
		Topic: topic, Partition: partition, RequiredAcks: kafka.RequireAll,
		Records: kafka.NewRecordReader(recs...),
	})
	require.NoError(t, err)
	require.NoError(t, resp.Error)
}

// got is one message handed to handle.
type got struct {
	topic     string
	partition int
	offset    int64
	value     string
}

func (g got) String() string {
	return fmt.Sprintf("%s/%d@%d=%s", g.topic, g.partition, g.offset, g.value)
}

// run is one ConsumeTopics call in a goroutine.
type run struct {
	msgs   chan got
	done   chan error
	cancel context.CancelFunc
	// handlers counts handle calls running at once, to check they are serial.
	handlers, maxHandlers atomic.Int32
}

func startConsume(t *testing.T, cl *kafkautil.Cluster, cfg kafkautil.ConsumeConfig) *run {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &run{msgs: make(chan got, 1024), done: make(chan error, 1), cancel: cancel}
	go func() {
		r.done <- kafkautil.ConsumeTopics(ctx, cl, cfg, func(_ context.Context, topic string, partition int, m kafka.Message) error {
			n := r.handlers.Add(1)
			defer r.handlers.Add(-1)
			if n > r.maxHandlers.Load() {
				r.maxHandlers.Store(n)
			}
			r.msgs <- got{topic, partition, m.Offset, string(m.Value)}
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(deadline):
			t.Errorf("ConsumeTopics did not return within %v of cancel", deadline)
		}
	})
	return r
}

// next returns the next n messages handled, failing after the deadline.
func (r *run) next(t *testing.T, n int) []got {
	t.Helper()
	var out []got
	timeout := time.After(deadline)
	for len(out) < n {
		select {
		case g := <-r.msgs:
			out = append(out, g)
		case err := <-r.done:
			t.Fatalf("ConsumeTopics returned early: %v (had %v)", err, out)
		case <-timeout:
			t.Fatalf("only %d of %d messages within %v: %v", len(out), n, deadline, out)
		}
	}
	return out
}

// stop cancels the call and returns its result.
func (r *run) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(deadline):
		t.Fatalf("ConsumeTopics did not return within %v of cancel", deadline)
	}
	return nil
}

// missingEvents records ConsumeConfig.Missing calls.
type missingEvents struct {
	ch    chan string
	count atomic.Int64
}

func (e *missingEvents) observe(topic string, missing bool) {
	if missing {
		e.count.Add(1)
	} else {
		e.count.Add(-1)
	}
	e.ch <- fmt.Sprintf("%s missing=%v", topic, missing)
}

func (e *missingEvents) next(t *testing.T) string {
	t.Helper()
	select {
	case s := <-e.ch:
		return s
	case <-time.After(deadline):
		t.Fatalf("no Missing call within %v", deadline)
	}
	return ""
}

// TestConsumeTopicsFindsTopicsAndPartitionsLater: a topic missing at start
// is waited for (and reported through Missing), partitions added to a known
// topic are found, every message of every partition is handled once, in
// offset order per partition, one handle call at a time; cancel returns the
// context's error and the missing count is back to zero.
func TestConsumeTopicsFindsTopicsAndPartitionsLater(t *testing.T) {
	cl := newCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	require.NoError(t, cl.EnsureTopics(ctx, kafkautil.RetainedTopic("a", 2, 1, time.Hour)))
	produce(t, cl, "a", 0, "a0-0", "a0-1")
	produce(t, cl, "a", 1, "a1-0")

	ev := &missingEvents{ch: make(chan string, 16)}
	r := startConsume(t, cl, kafkautil.ConsumeConfig{
		Topics:       []string{"a", "b"},
		PollInterval: 100 * time.Millisecond,
		Missing:      ev.observe,
	})
	assert.ElementsMatch(t, []string{"a/0@0=a0-0", "a/0@1=a0-1", "a/1@0=a1-0"}, strs(r.next(t, 3)))
	assert.Equal(t, "b missing=true", ev.next(t))

	require.NoError(t, cl.EnsureTopics(ctx, kafkautil.RetainedTopic("b", 1, 1, time.Hour)))
	produce(t, cl, "b", 0, "b0-0")
	assert.Equal(t, []string{"b/0@0=b0-0"}, strs(r.next(t, 1)))
	assert.Equal(t, "b missing=false", ev.next(t))

	resp, err := cl.Client().CreatePartitions(ctx, &kafka.CreatePartitionsRequest{
		Topics: []kafka.TopicPartitionsConfig{{Name: "a", Count: 3}},
	})
	require.NoError(t, err)
	require.NoError(t, resp.Errors["a"])
	// The shared metadata cache learns of the partition within its TTL.
	require.Eventually(t, func() bool {
		ids, err := cl.Partitions(ctx, "a")
		return err == nil && len(ids) == 3
	}, deadline, 20*time.Millisecond)
	produce(t, cl, "a", 2, "a2-0", "a2-1")
	produce(t, cl, "a", 0, "a0-2")
	msgs := r.next(t, 3)
	assert.ElementsMatch(t, []string{"a/2@0=a2-0", "a/2@1=a2-1", "a/0@2=a0-2"}, strs(msgs))
	assert.Less(t, indexOf(msgs, "a/2@0=a2-0"), indexOf(msgs, "a/2@1=a2-1"), "offset order within a partition")

	require.ErrorIs(t, r.stop(t), context.Canceled)
	assert.EqualValues(t, 1, r.maxHandlers.Load(), "handle calls must not overlap")
	assert.Zero(t, ev.count.Load(), "Missing calls balance")
	select {
	case g := <-r.msgs:
		t.Fatalf("unexpected message %v", g)
	default:
	}
}

// TestConsumeTopicsSelect: with Select, only the partitions it names are
// read (ids out of range and repeats ignored); it is asked again with the
// new count when partitions are added, and a partition it chose before
// stays read after it no longer names it.
func TestConsumeTopicsSelect(t *testing.T) {
	cl := newCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	require.NoError(t, cl.EnsureTopics(ctx, kafkautil.RetainedTopic("s", 3, 1, time.Hour)))
	produce(t, cl, "s", 0, "s0-0")
	produce(t, cl, "s", 1, "s1-0")
	produce(t, cl, "s", 2, "s2-0")

	var mu sync.Mutex
	counts := map[int]bool{}
	r := startConsume(t, cl, kafkautil.ConsumeConfig{
		Topics:       []string{"s"},
		PollInterval: 100 * time.Millisecond,
		// The last partition, repeated, and one out of range.
		Select: func(topic string, partitions int) []int {
			assert.Equal(t, "s", topic)
			mu.Lock()
			counts[partitions] = true
			mu.Unlock()
			return []int{partitions - 1, 7, partitions - 1}
		},
	})
	first := r.next(t, 1)
	assert.Equal(t, []string{"s/2@0=s2-0"}, strs(first))

	resp, err := cl.Client().CreatePartitions(ctx, &kafka.CreatePartitionsRequest{
		Topics: []kafka.TopicPartitionsConfig{{Name: "s", Count: 4}},
	})
	require.NoError(t, err)
	require.NoError(t, resp.Errors["s"])
	require.Eventually(t, func() bool {
		ids, err := cl.Partitions(ctx, "s")
		return err == nil && len(ids) == 4
	}, deadline, 20*time.Millisecond)
	produce(t, cl, "s", 0, "s0-1")
	produce(t, cl, "s", 3, "s3-0")
	produce(t, cl, "s", 2, "s2-1")
	later := r.next(t, 2)
	assert.ElementsMatch(t, []string{"s/3@0=s3-0", "s/2@1=s2-1"}, strs(later), "the added partition is selected, the one selected before stays read")
	require.ErrorIs(t, r.stop(t), context.Canceled)
	close(r.msgs)
	for g := range r.msgs {
		t.Errorf("message of a partition not selected: %v", g)
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, map[int]bool{3: true, 4: true}, counts, "Select is given each partition count seen")
}

// TestConsumeTopicsStartOffsetsAndRestart: partitions start where
// StartOffsets says; a reader whose offset is out of range asks
// StartOffsets again for its partition, reports the move through Restarted,
// and reads on from there.
func TestConsumeTopicsStartOffsetsAndRestart(t *testing.T) {
	cl := newCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	require.NoError(t, cl.EnsureTopics(ctx, kafkautil.RetainedTopic("t", 1, 1, time.Hour)))
	produce(t, cl, "t", 0, "v0", "v1", "v2", "v3", "v4")

	var mu sync.Mutex
	var calls [][]int
	starts := []int64{100, 3} // first past the end: out of range
	var restarted []string
	r := startConsume(t, cl, kafkautil.ConsumeConfig{
		Topics:       []string{"t"},
		PollInterval: 100 * time.Millisecond,
		StartOffsets: func(_ context.Context, topic string, partitions []int) (map[int]int64, error) {
			mu.Lock()
			defer mu.Unlock()
			assert.Equal(t, "t", topic)
			calls = append(calls, partitions)
			off := starts[min(len(calls), len(starts))-1]
			return map[int]int64{partitions[0]: off}, nil
		},
		Restarted: func(topic string, partition int, offset int64) {
			mu.Lock()
			defer mu.Unlock()
			restarted = append(restarted, fmt.Sprintf("%s/%d@%d", topic, partition, offset))
		},
	})
	assert.Equal(t, []string{"t/0@3=v3", "t/0@4=v4"}, strs(r.next(t, 2)))
	produce(t, cl, "t", 0, "v5")
	assert.Equal(t, []string{"t/0@5=v5"}, strs(r.next(t, 1)))
	require.ErrorIs(t, r.stop(t), context.Canceled)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, [][]int{{0}, {0}}, calls)
	assert.Equal(t, []string{"t/0@3"}, restarted)
}

// TestConsumeTopicsHandleErrorStopsAll: the first error handle returns stops
// every reader and is returned as is.
func TestConsumeTopicsHandleErrorStopsAll(t *testing.T) {
	cl := newCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	require.NoError(t, cl.EnsureTopics(ctx, kafkautil.RetainedTopic("t", 3, 1, time.Hour)))
	for p := range 3 {
		produce(t, cl, "t", p, "x", "y")
	}
	boom := errors.New("boom")
	handled := 0
	err := kafkautil.ConsumeTopics(ctx, cl, kafkautil.ConsumeConfig{Topics: []string{"t"}},
		func(_ context.Context, _ string, _ int, m kafka.Message) error {
			handled++
			if handled == 2 {
				return fmt.Errorf("handling %q: %w", m.Value, boom)
			}
			return nil
		})
	require.ErrorIs(t, err, boom)
	assert.Equal(t, 2, handled, "no handle call after the error")
	require.NoError(t, ctx.Err(), "returned on the error, not the deadline")
}

// TestConsumeTopicsFirstOffsetsDefault: with no StartOffsets, every
// partition is read from its first offset.
func TestConsumeTopicsFirstOffsetsDefault(t *testing.T) {
	cl := newCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	require.NoError(t, cl.EnsureTopics(ctx, kafkautil.CompactedTopic("c", 1, 1)))
	produce(t, cl, "c", 0, "first", "second")
	r := startConsume(t, cl, kafkautil.ConsumeConfig{Topics: []string{"c"}})
	assert.Equal(t, []string{"c/0@0=first", "c/0@1=second"}, strs(r.next(t, 2)))

	offs, err := kafkautil.FirstOffsets(ctx, "c", []int{0, 4})
	require.NoError(t, err)
	assert.Equal(t, map[int]int64{0: kafka.FirstOffset, 4: kafka.FirstOffset}, offs)
}

func TestConsumeTopicsConfigErrors(t *testing.T) {
	cl, err := kafkautil.New(kafkautil.DefaultConfig("127.0.0.1:9092"))
	require.NoError(t, err)
	nop := func(context.Context, string, int, kafka.Message) error { return nil }
	for _, tc := range []struct {
		cfg  kafkautil.ConsumeConfig
		want string
	}{
		{kafkautil.ConsumeConfig{}, "consume topics: at least one"},
		{kafkautil.ConsumeConfig{Topics: []string{"a", ""}}, "consume topics[1] is empty"},
		{kafkautil.ConsumeConfig{Topics: []string{"a", "a"}}, `"a" listed twice`},
		{kafkautil.ConsumeConfig{Topics: []string{"a"}, PollInterval: -time.Second}, "poll interval -1s"},
		{kafkautil.ConsumeConfig{Topics: []string{"a"}, Buffer: -1}, "buffer -1"},
	} {
		err := kafkautil.ConsumeTopics(context.Background(), cl, tc.cfg, nop)
		require.ErrorIs(t, err, kafkautil.ErrConfig)
		assert.ErrorContains(t, err, tc.want)
	}
	err = kafkautil.ConsumeTopics(context.Background(), nil, kafkautil.ConsumeConfig{Topics: []string{"a"}}, nop)
	assert.ErrorContains(t, err, "cluster is nil")
	err = kafkautil.ConsumeTopics(context.Background(), cl, kafkautil.ConsumeConfig{Topics: []string{"a"}}, nil)
	assert.ErrorContains(t, err, "handle is nil")
}

func TestBusConfigFill(t *testing.T) {
	errMine := errors.New("mine: invalid config")
	defaults := kafkautil.BusConfig{
		Topic: "q.usage", Partitions: 3, ReplicationFactor: -1, Retention: time.Hour, TopicPollInterval: 5 * time.Second,
	}
	var b kafkautil.BusConfig
	require.NoError(t, b.Fill(defaults, errMine))
	assert.Equal(t, []string{"q.usage"}, b.ConsumeTopics)
	assert.Equal(t, 3, b.Partitions)
	assert.Equal(t, -1, b.ReplicationFactor)
	assert.Equal(t, time.Hour, b.Retention)
	assert.Equal(t, 5*time.Second, b.TopicPollInterval)
	require.NotNil(t, b.Now)

	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	b = kafkautil.BusConfig{Topic: "x", Partitions: 12, Now: func() time.Time { return t0 }}
	require.NoError(t, b.Fill(defaults, errMine))
	assert.Equal(t, []string{"x"}, b.ConsumeTopics, "consumes its own topic by default")
	assert.Equal(t, 12, b.Partitions, "set fields are kept")
	assert.Equal(t, t0, b.Now())

	for _, tc := range []struct {
		b    kafkautil.BusConfig
		want string
	}{
		{kafkautil.BusConfig{ConsumeTopics: []string{""}}, "consume topics[0] is empty"},
		{kafkautil.BusConfig{ConsumeTopics: []string{"a", "a"}}, `consume topics: "a" listed twice`},
		{kafkautil.BusConfig{Partitions: -2}, "partitions -2"},
		{kafkautil.BusConfig{ReplicationFactor: -3}, "replication factor -3"},
		{kafkautil.BusConfig{Retention: -time.Second}, "retention -1s"},
		{kafkautil.BusConfig{TopicPollInterval: -time.Second}, "topic poll interval -1s"},
	} {
		err := tc.b.Fill(defaults, errMine)
		require.ErrorIs(t, err, errMine, tc.want)
		assert.ErrorContains(t, err, tc.want)
	}
	err := (&kafkautil.BusConfig{}).Fill(kafkautil.BusConfig{}, nil)
	require.ErrorIs(t, err, kafkautil.ErrConfig)
	assert.ErrorContains(t, err, "topic is empty")

	assert.Equal(t, []string{"t", "eu.t", "ap.t"}, kafkautil.MirroredTopics("t", "eu", "ap"))
}

func strs(gs []got) []string {
	out := make([]string, len(gs))
	for i, g := range gs {
		out[i] = g.String()
	}
	return out
}

func indexOf(gs []got, s string) int {
	for i, g := range gs {
		if g.String() == s {
			return i
		}
	}
	return -1
}

// TestProducerCreatesTopicOnFirstWrite: a Producer with a TopicSpec creates
// its topic on the first Write and writes at once; one without fails with an
// unknown-topic error on a missing topic; Write after Close is ErrClosed.
func TestProducerCreatesTopicOnFirstWrite(t *testing.T) {
	cl := newCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()

	spec := kafkautil.RetainedTopic("made", 2, 1, time.Hour)
	p, err := cl.NewProducer(kafkautil.DefaultWriterConfig("made"), &spec)
	require.NoError(t, err)
	_, err = cl.Partitions(ctx, "made")
	require.ErrorIs(t, err, kafkautil.ErrUnknownTopic, "NewProducer does no I/O")
	require.NoError(t, p.Write(ctx, kafka.Message{Key: []byte("k"), Value: []byte("v")}))
	ids, err := cl.Partitions(ctx, "made")
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, ids)
	require.NoError(t, p.Write(ctx, kafka.Message{Key: []byte("k"), Value: []byte("w")}))

	r := startConsume(t, cl, kafkautil.ConsumeConfig{Topics: []string{"made"}})
	msgs := r.next(t, 2)
	assert.Equal(t, msgs[0].partition, msgs[1].partition, "one key, one partition")
	assert.Equal(t, []string{"v", "w"}, []string{msgs[0].value, msgs[1].value})

	require.NoError(t, p.Close())
	require.NoError(t, p.Close(), "closing again is fine")
	require.ErrorIs(t, p.Write(ctx, kafka.Message{Value: []byte("late")}), kafkautil.ErrClosed)

	managed, err := cl.NewProducer(kafkautil.DefaultWriterConfig("managed"), nil)
	require.NoError(t, err)
	defer managed.Close()
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	err = managed.Write(short, kafka.Message{Value: []byte("x")})
	require.Error(t, err)
	assert.True(t, kafkautil.IsUnknownTopic(err), "want an unknown-topic error, got %v", err)

	_, err = cl.NewProducer(kafkautil.DefaultWriterConfig("bad"), &kafkautil.TopicSpec{Name: "bad", Partitions: 0, ReplicationFactor: 1})
	require.ErrorIs(t, err, kafkautil.ErrConfig)
	assert.ErrorContains(t, err, `topic "bad": partitions 0`)
}

// TestConsumeTopicsStopsWithoutWaitingForHeldFetches: with fetches the
// broker holds open for 29 s (MaxWait 30 s), ConsumeTopics returns soon
// after its context ends, not when the held fetches are answered: the
// readers' connections are closed first (kafka.Reader.Close alone waits
// for the fetch in flight).
func TestConsumeTopicsStopsWithoutWaitingForHeldFetches(t *testing.T) {
	cl := newCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	require.NoError(t, cl.EnsureTopics(ctx, kafkautil.RetainedTopic("held", 3, 1, time.Hour)))
	produce(t, cl, "held", 1, "one")
	r := startConsume(t, cl, kafkautil.ConsumeConfig{Topics: []string{"held"}, Reader: kafkautil.ReaderConfig{MaxWait: 30 * time.Second}})
	assert.Equal(t, []string{"held/1@0=one"}, strs(r.next(t, 1)))
	produce(t, cl, "held", 1, "two") // the reader of partition 1 has fetched again, after the first answer
	assert.Equal(t, []string{"held/1@1=two"}, strs(r.next(t, 1)))

	t0 := time.Now()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err
		assert.ErrorIs(t, err, context.Canceled)
	case <-time.After(20 * time.Second):
		t.Fatal("ConsumeTopics waited for the held fetches (29 s) instead of returning when its context ended")
	}
	t.Logf("returned %v after cancel", time.Since(t0).Round(time.Millisecond))
}
