package kafkabus_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"google.golang.org/protobuf/proto"

	"github.com/quotientlabs/quotient/internal/kafkautil"
	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
	"github.com/quotientlabs/quotient/rebalancer/kafkabus"
)

// wait bounds every wait in these tests.
const wait = 30 * time.Second

func startKafka(tb testing.TB) []string {
	tb.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(3))
	require.NoError(tb, err)
	tb.Cleanup(c.Close)
	return c.ListenAddrs()
}

func newBus(tb testing.TB, brokers []string, mutate func(*kafkabus.Config)) *kafkabus.Bus {
	tb.Helper()
	cl, err := kafkautil.New(kafkautil.DefaultConfig(brokers...))
	require.NoError(tb, err)
	cfg := kafkabus.DefaultConfig()
	cfg.TopicPollInterval = 200 * time.Millisecond
	if mutate != nil {
		mutate(&cfg)
	}
	b, err := kafkabus.New(cl, cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() {
		assert.NoError(tb, b.Close())
		assert.NoError(tb, cl.Close())
	})
	return b
}

// consumer runs Bus.Run in a goroutine and hands the reports to a channel.
type consumer struct {
	ch     chan *quotientv1.UsageReport
	cancel context.CancelFunc
	done   chan error
}

func consume(tb testing.TB, b *kafkabus.Bus) *consumer {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &consumer{ch: make(chan *quotientv1.UsageReport, 1024), cancel: cancel, done: make(chan error, 1)}
	go func() { c.done <- b.Run(ctx, func(r *quotientv1.UsageReport) { c.ch <- r }) }()
	tb.Cleanup(func() { c.stop(tb) })
	return c
}

// stop cancels Run and checks that it returns the context's error in time.
func (c *consumer) stop(tb testing.TB) {
	c.cancel()
	select {
	case err := <-c.done:
		assert.ErrorIs(tb, err, context.Canceled)
		c.done <- err // let a second stop see it too
	case <-time.After(wait):
		tb.Errorf("Run did not return within %v of cancel", wait)
	}
}

// next returns the next report or fails after the deadline.
func (c *consumer) next(tb testing.TB) *quotientv1.UsageReport {
	tb.Helper()
	select {
	case r := <-c.ch:
		return r
	case err := <-c.done:
		tb.Fatalf("Run returned early: %v", err)
	case <-time.After(wait):
		tb.Fatalf("no report within %v", wait)
	}
	return nil
}

func report(region string, epoch, seq int64, keys int) *quotientv1.UsageReport {
	r := &quotientv1.UsageReport{
		Region: region, Epoch: epoch, EpochMs: 10_000, Seq: seq, SentUnixMs: epoch*10_000 + 10_001,
		Heard: []*quotientv1.RegionHeard{{Region: "eu", LastEpoch: epoch - 1}, {Region: region, LastEpoch: epoch}},
	}
	for i := range keys {
		r.Keys = append(r.Keys, &quotientv1.KeyUsage{
			PolicyId: "p-global", Subject: fmt.Sprintf("key:%s:%07d", region, i),
			Demand: int64(100 + i), Admitted: int64(50 + i), SmoothedDemandMilli: int64(i) * 1000,
			ShareRateMilli: 333_333, ShareBurstMilli: 1_000_000,
		})
	}
	return r
}

type reportID struct {
	region     string
	epoch, seq int64
}

func idOf(r *quotientv1.UsageReport) reportID {
	return reportID{r.GetRegion(), r.GetEpoch(), r.GetSeq()}
}

// TestThreeRegionsEveryoneGetsEveryReport: consumers start before the topic
// exists (unknown topic at start), then three regions publish; every
// consumer receives every report, whole, once, each region's in order.
func TestThreeRegionsEveryoneGetsEveryReport(t *testing.T) {
	brokers := startKafka(t)
	regions := []string{"us", "eu", "ap"}
	buses := map[string]*kafkabus.Bus{}
	consumers := map[string]*consumer{}
	for _, r := range regions {
		buses[r] = newBus(t, brokers, nil)
		consumers[r] = consume(t, buses[r])
	}

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	const epochs = 4
	want := map[reportID]*quotientv1.UsageReport{}
	var wg sync.WaitGroup
	for _, r := range regions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := int64(1); e <= epochs; e++ {
				assert.NoError(t, buses[r].Publish(ctx, report(r, 100+e, e, 50)))
			}
		}()
		for e := int64(1); e <= epochs; e++ {
			rep := report(r, 100+e, e, 50)
			want[idOf(rep)] = rep
		}
	}
	wg.Wait()

	for _, name := range regions {
		c := consumers[name]
		got := map[reportID]bool{}
		lastSeq := map[string]int64{}
		for range len(want) {
			r := c.next(t)
			id := idOf(r)
			require.False(t, got[id], "consumer %s: %v delivered twice", name, id)
			got[id] = true
			require.Greater(t, r.GetSeq(), lastSeq[r.GetRegion()], "consumer %s: region %s out of order", name, r.GetRegion())
			lastSeq[r.GetRegion()] = r.GetSeq()
			require.True(t, proto.Equal(want[id], r), "consumer %s: %v differs from what was published", name, id)
		}
		assert.Len(t, got, len(want))
	}
	for _, r := range regions {
		s := buses[r].Stats()
		assert.EqualValues(t, epochs, s.PublishedReports)
		assert.EqualValues(t, len(want), s.DeliveredReports)
		assert.Zero(t, s.Malformed)
		assert.Zero(t, s.MissingTopics)
	}
}

// TestLargeReportArrivesWhole: a report many times the message size is
// split into parts and delivered as one report equal to the original.
func TestLargeReportArrivesWhole(t *testing.T) {
	brokers := startKafka(t)
	small := func(c *kafkabus.Config) { c.MaxMessageBytes = 16 << 10 }
	pub := newBus(t, brokers, small)
	sub := newBus(t, brokers, small)
	c := consume(t, sub)

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	big := report("us", 7, 3, 5000)
	before := proto.Clone(big)
	require.NoError(t, pub.Publish(ctx, big))
	require.True(t, proto.Equal(before, big), "Publish modified the caller's report")

	got := c.next(t)
	require.True(t, proto.Equal(big, got), "assembled report differs from the published one")
	s := pub.Stats()
	assert.Greater(t, s.PublishedParts, int64(10), "a 5000-key report should need many 16 KiB parts")
	assert.Equal(t, s.PublishedParts, sub.Stats().ConsumedParts)
	assert.EqualValues(t, 1, sub.Stats().DeliveredReports)
}

// fakeClock is a settable clock for record timestamps and start times.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.t = t }

// TestRestartedConsumerStartsAtLookback: reports published over ten
// (virtual) epochs; a consumer started afterwards gets exactly those inside
// its lookback, in order, and then new ones.
func TestRestartedConsumerStartsAtLookback(t *testing.T) {
	brokers := startKafka(t)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := &fakeClock{t: t0}
	cfg := func(c *kafkabus.Config) { c.Now = clock.Now; c.Lookback = 35 * time.Second }
	pub := newBus(t, brokers, cfg)

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for i := range int64(10) {
		clock.Set(t0.Add(time.Duration(i) * 10 * time.Second))
		require.NoError(t, pub.Publish(ctx, report("us", 1000+i, i+1, 3)))
	}

	// The coordinator restarts at t0+95s: lookback 35 s reaches back to
	// t0+60s, i.e. the reports of i = 6..9.
	clock.Set(t0.Add(95 * time.Second))
	sub := newBus(t, brokers, cfg)
	c := consume(t, sub)
	for i := int64(6); i < 10; i++ {
		r := c.next(t)
		require.Equal(t, reportID{"us", 1000 + i, i + 1}, idOf(r))
	}
	// Nothing older follows: the next report delivered is a new one.
	require.NoError(t, pub.Publish(ctx, report("us", 1010, 11, 3)))
	assert.Equal(t, reportID{"us", 1010, 11}, idOf(c.next(t)))

	// A second restart sees the same window again (plus the new report):
	// at-least-once, receivers dedupe by (region, epoch, seq).
	c.stop(t)
	again := consume(t, sub)
	for i := int64(6); i <= 10; i++ {
		assert.Equal(t, reportID{"us", 1000 + i, i + 1}, idOf(again.next(t)))
	}
}

// TestMirroredLayout: in the MirrorMaker 2 layout a region reads its local
// topic and one "<region>.quotient.usage" per remote region. A remote topic
// missing at start (mirror not yet running) is waited for.
func TestMirroredLayout(t *testing.T) {
	brokers := startKafka(t)
	// One broker stands in for region us's cluster; the remote region eu's
	// mirrored topic is written directly, as MirrorMaker 2 would.
	local := newBus(t, brokers, nil)
	mirror := newBus(t, brokers, func(c *kafkabus.Config) { c.Topic = "eu." + kafkabus.DefaultTopic })
	sub := newBus(t, brokers, func(c *kafkabus.Config) {
		c.ConsumeTopics = kafkabus.MirroredTopics(kafkabus.DefaultTopic, "eu")
	})
	require.Equal(t, []string{"quotient.usage", "eu.quotient.usage"}, kafkabus.MirroredTopics(kafkabus.DefaultTopic, "eu"))
	c := consume(t, sub)

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, local.Publish(ctx, report("us", 5, 1, 10)))
	assert.Equal(t, reportID{"us", 5, 1}, idOf(c.next(t)))
	require.NoError(t, mirror.Publish(ctx, report("eu", 5, 1, 10)))
	assert.Equal(t, reportID{"eu", 5, 1}, idOf(c.next(t)))
}

// TestPublishUnknownTopicWithoutCreation: with topic creation off, Publish
// to a missing topic fails with an unknown-topic error once its context
// ends, and succeeds once the topic exists.
func TestPublishUnknownTopicWithoutCreation(t *testing.T) {
	brokers := startKafka(t)
	pub := newBus(t, brokers, func(c *kafkabus.Config) { c.SkipCreateTopic = true; c.Topic = "managed.usage" })

	short, cancelShort := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancelShort()
	err := pub.Publish(short, report("us", 1, 1, 1))
	require.Error(t, err)
	assert.True(t, kafkautil.IsUnknownTopic(err), "want an unknown-topic error, got %v", err)

	admin, err := kafkautil.New(kafkautil.DefaultConfig(brokers...))
	require.NoError(t, err)
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, admin.EnsureTopics(ctx, kafkautil.RetainedTopic("managed.usage", 1, 1, time.Hour)))
	// Created on another connection: pub's metadata cache learns of it
	// within its TTL, and Publish retries the unknown topic meanwhile.
	require.NoError(t, pub.Publish(ctx, report("us", 1, 1, 1)))
}

func TestPublishRejectsBadReports(t *testing.T) {
	pub := newBus(t, []string{"127.0.0.1:1"}, func(c *kafkabus.Config) { c.MaxMessageBytes = 4096 })
	huge := report("us", 1, 1, 1)
	huge.Keys[0].Subject = string(make([]byte, 5000))
	cases := []struct {
		name string
		r    *quotientv1.UsageReport
		want string
	}{
		{"nil", nil, "report is nil"},
		{"no region", &quotientv1.UsageReport{EpochMs: 1, Seq: 1}, "region is empty"},
		{"no epoch_ms", &quotientv1.UsageReport{Region: "us", Seq: 1}, "epoch_ms 0"},
		{"no seq", &quotientv1.UsageReport{Region: "us", EpochMs: 1}, "seq 0"},
		{"a part", &quotientv1.UsageReport{Region: "us", EpochMs: 1, Seq: 1, Part: 1, Parts: 2}, "part 1 of 2"},
		{"nil key", &quotientv1.UsageReport{Region: "us", EpochMs: 1, Seq: 1, Keys: []*quotientv1.KeyUsage{nil}}, "keys[0] is nil"},
		{"key too large", huge, "keys[0] (policy \"p-global\""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := pub.Publish(context.Background(), tc.r)
			require.ErrorIs(t, err, kafkabus.ErrInvalidReport)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	assert.Zero(t, pub.Stats().PublishedParts)
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*kafkabus.Config)
		want   string
	}{
		{"small messages", func(c *kafkabus.Config) { c.MaxMessageBytes = 100 }, "max message bytes 100"},
		{"negative lookback", func(c *kafkabus.Config) { c.Lookback = -time.Second }, "lookback -1s"},
		{"empty consume topic", func(c *kafkabus.Config) { c.ConsumeTopics = []string{"a", ""} }, "consume topics[1] is empty"},
		{"duplicate consume topic", func(c *kafkabus.Config) { c.ConsumeTopics = []string{"a", "a"} }, `"a" listed twice`},
		{"negative retention", func(c *kafkabus.Config) { c.Retention = -1 }, "retention"},
		{"short fetch wait", func(c *kafkabus.Config) { c.FetchWait = 500 * time.Millisecond }, "fetch wait 500ms: want at least 2s"},
		{"negative warm interval", func(c *kafkabus.Config) { c.WarmInterval = -time.Second }, "warm interval -1s"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := kafkabus.DefaultConfig()
			tc.mutate(&cfg)
			err := cfg.Validate()
			require.ErrorIs(t, err, kafkabus.ErrConfig)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	cfg := kafkabus.Config{}
	require.NoError(t, cfg.Validate())
	assert.Equal(t, []string{kafkabus.DefaultTopic}, cfg.ConsumeTopics)
	assert.Equal(t, 60*time.Second, cfg.Lookback)
	assert.False(t, cfg.SkipCreateTopic)
	assert.Equal(t, 5*time.Second, cfg.FetchWait)
	assert.Equal(t, 10*time.Second, cfg.WarmInterval)
	_, err := kafkabus.New(nil, kafkabus.DefaultConfig())
	assert.True(t, errors.Is(err, kafkabus.ErrConfig))
}
