package kafkabus_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/quotientlabs/quotient/internal/kafkautil"
	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
	"github.com/quotientlabs/quotient/rebalancer/kafkabus"
)

func newTransferBus(tb testing.TB, brokers []string, mutate func(*kafkabus.TransferConfig)) (*kafkabus.TransferBus, *kafkautil.Cluster) {
	tb.Helper()
	cl, err := kafkautil.New(kafkautil.DefaultConfig(brokers...))
	require.NoError(tb, err)
	cfg := kafkabus.DefaultTransferConfig()
	cfg.TopicPollInterval = 200 * time.Millisecond
	if mutate != nil {
		mutate(&cfg)
	}
	b, err := kafkabus.NewTransferBus(cl, cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() {
		assert.NoError(tb, b.Close())
		assert.NoError(tb, cl.Close())
	})
	return b, cl
}

// transferConsumer runs TransferBus.Run and hands the messages to a channel.
type transferConsumer struct {
	ch   chan *quotientv1.TransferMessage
	done chan error
}

func consumeTransfers(tb testing.TB, b *kafkabus.TransferBus) *transferConsumer {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &transferConsumer{ch: make(chan *quotientv1.TransferMessage, 1024), done: make(chan error, 1)}
	go func() { c.done <- b.Run(ctx, func(m *quotientv1.TransferMessage) { c.ch <- m }) }()
	tb.Cleanup(func() {
		cancel()
		select {
		case err := <-c.done:
			assert.ErrorIs(tb, err, context.Canceled)
		case <-time.After(wait):
			tb.Errorf("Run did not return within %v of cancel", wait)
		}
	})
	return c
}

func (c *transferConsumer) next(tb testing.TB) *quotientv1.TransferMessage {
	tb.Helper()
	select {
	case m := <-c.ch:
		return m
	case err := <-c.done:
		tb.Fatalf("Run returned early: %v", err)
	case <-time.After(wait):
		tb.Fatalf("no transfer message within %v", wait)
	}
	return nil
}

func ask(region string, keys int) *quotientv1.TransferAsk {
	a := &quotientv1.TransferAsk{Region: region, Epoch: 41, EpochMs: 10_000, SentUnixMs: 420_123}
	for i := range keys {
		a.Keys = append(a.Keys, &quotientv1.AskKey{PolicyId: "p", Subject: fmt.Sprintf("k:%s-%06d", region, i), NeedRateMilli: int64(1000 + i), NeedBurstMilli: int64(i)})
	}
	return a
}

func give(from, to string, id int64) *quotientv1.TransferGive {
	return &quotientv1.TransferGive{From: from, To: to, Id: id, Transfer: 42, EpochMs: 10_000, SentUnixMs: 420_456,
		Keys: []*quotientv1.GiveKey{{PolicyId: "p", Subject: "k:x", AmountRateMilli: 5000, AmountBurstMilli: 5000}}}
}

// TestTransfersReachEveryRegion: three regions on the default transfer
// topic (created by the first publication, consumers waiting for it); each
// consumer gets every ask and give, as published, each region's in order.
func TestTransfersReachEveryRegion(t *testing.T) {
	brokers := startKafka(t)
	regions := []string{"us", "eu", "ap"}
	buses := map[string]*kafkabus.TransferBus{}
	consumers := map[string]*transferConsumer{}
	var cl *kafkautil.Cluster
	for _, r := range regions {
		buses[r], cl = newTransferBus(t, brokers, nil)
		consumers[r] = consumeTransfers(t, buses[r])
	}
	assert.Equal(t, "quotient.usage-transfers", buses["us"].Topic())

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var wg sync.WaitGroup
	for i, r := range regions {
		wg.Go(func() {
			for n := range int64(3) {
				assert.NoError(t, buses[r].PublishAsk(ctx, ask(r, 2)))
				assert.NoError(t, buses[r].PublishGive(ctx, give(r, regions[(i+1)%3], 100+n)))
			}
		})
	}
	wg.Wait()
	for _, name := range regions {
		lastID := map[string]int64{}
		asks := map[string]int{}
		for range 18 {
			m := consumers[name].next(t)
			if a := m.GetAsk(); a != nil {
				asks[a.GetRegion()]++
				assert.True(t, proto.Equal(ask(a.GetRegion(), 2), a), "consumer %s: the ask differs from the published one", name)
				continue
			}
			g := m.GetGive()
			require.NotNil(t, g)
			assert.Greater(t, g.GetId(), lastID[g.GetFrom()], "consumer %s: gives of %s out of order", name, g.GetFrom())
			lastID[g.GetFrom()] = g.GetId()
		}
		assert.Equal(t, map[string]int{"us": 3, "eu": 3, "ap": 3}, asks, name)
		assert.Equal(t, map[string]int64{"us": 102, "eu": 102, "ap": 102}, lastID, name)
	}
	for _, r := range regions {
		s := buses[r].Stats()
		assert.EqualValues(t, 3, s.PublishedAsks)
		assert.EqualValues(t, 3, s.PublishedGives)
		assert.EqualValues(t, 9, s.DeliveredAsks)
		assert.EqualValues(t, 9, s.DeliveredGives)
		assert.Zero(t, s.Malformed)
	}
	parts, err := cl.Partitions(ctx, "quotient.usage-transfers")
	require.NoError(t, err)
	assert.Len(t, parts, 3, "the topic the bus created")
}

// TestLargeAskIsSplit: an ask larger than a message goes as several asks,
// each with its share of the keys, together the whole ask.
func TestLargeAskIsSplit(t *testing.T) {
	brokers := startKafka(t)
	small := func(c *kafkabus.TransferConfig) { c.MaxMessageBytes = 8 << 10 }
	pub, _ := newTransferBus(t, brokers, small)
	sub, _ := newTransferBus(t, brokers, small)
	c := consumeTransfers(t, sub)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	big := ask("us", 2000)
	require.NoError(t, pub.PublishAsk(ctx, big))
	msgs := pub.Stats().PublishedMessages
	assert.Greater(t, msgs, int64(5), "2000 keys need several 8 KiB messages")
	var keys []*quotientv1.AskKey
	for range msgs {
		a := c.next(t).GetAsk()
		require.NotNil(t, a)
		assert.Equal(t, "us", a.GetRegion())
		assert.EqualValues(t, 41, a.GetEpoch())
		keys = append(keys, a.GetKeys()...)
	}
	require.Len(t, keys, len(big.Keys))
	for i := range keys {
		require.True(t, proto.Equal(big.Keys[i], keys[i]), "key %d", i)
	}
	// One give must fit one message.
	huge := give("us", "eu", 1)
	for i := range 2000 {
		huge.Keys = append(huge.Keys, &quotientv1.GiveKey{PolicyId: "p", Subject: fmt.Sprintf("k:%06d", i), AmountRateMilli: 1})
	}
	err := pub.PublishGive(ctx, huge)
	require.ErrorIs(t, err, kafkabus.ErrInvalidTransfer)
	assert.Contains(t, err.Error(), "more than one message")
}

// TestMalformedTransferIsCountedAndSkipped: garbage, an empty envelope and
// an invalid give on the topic are skipped, counted and reported with what
// was wrong; the valid message after them is delivered.
func TestMalformedTransferIsCountedAndSkipped(t *testing.T) {
	brokers := startKafka(t)
	var mu sync.Mutex
	var reasons []string
	sub, cl := newTransferBus(t, brokers, func(c *kafkabus.TransferConfig) {
		c.OnMalformed = func(err error) {
			mu.Lock()
			defer mu.Unlock()
			assert.ErrorIs(t, err, kafkabus.ErrInvalidTransfer)
			reasons = append(reasons, err.Error())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, cl.EnsureTopics(ctx, kafkautil.RetainedTopic(sub.Topic(), 1, -1, time.Hour)))
	c := consumeTransfers(t, sub)
	w, err := cl.NewWriter(kafkautil.DefaultWriterConfig(sub.Topic()))
	require.NoError(t, err)
	defer w.Close()
	empty, err := proto.Marshal(&quotientv1.TransferMessage{})
	require.NoError(t, err)
	bad := give("us", "us", 1) // to itself
	selfGive, err := proto.Marshal(&quotientv1.TransferMessage{Kind: &quotientv1.TransferMessage_Give{Give: bad}})
	require.NoError(t, err)
	good, err := proto.Marshal(&quotientv1.TransferMessage{Kind: &quotientv1.TransferMessage_Ask{Ask: ask("eu", 1)}})
	require.NoError(t, err)
	require.NoError(t, w.WriteMessages(ctx,
		kafka.Message{Key: []byte("x"), Value: []byte{0xff, 0xff, 0xff}},
		kafka.Message{Key: []byte("x"), Value: empty},
		kafka.Message{Key: []byte("x"), Value: selfGive},
		kafka.Message{Key: []byte("eu"), Value: good},
	))
	got := c.next(t)
	require.NotNil(t, got.GetAsk(), "the valid ask after the malformed messages")
	assert.Equal(t, "eu", got.GetAsk().GetRegion())
	assert.EqualValues(t, 3, sub.Stats().Malformed)
	assert.EqualValues(t, 1, sub.Stats().DeliveredAsks)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, reasons, 3)
	assert.Contains(t, reasons[0], "do not decode")
	assert.Contains(t, reasons[1], "neither an ask nor a give")
	assert.Contains(t, reasons[2], `give from "us" to itself`)
	assert.Contains(t, reasons[2], "partition 0 offset 2")
}

// TestPublishRejectsInvalidTransfers: what a receiver would skip is never
// sent; the error names the field.
func TestPublishRejectsInvalidTransfers(t *testing.T) {
	brokers := startKafka(t)
	pub, _ := newTransferBus(t, brokers, nil)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	asks := map[string]*quotientv1.TransferAsk{
		"region is empty":   {EpochMs: 1, Keys: ask("us", 1).Keys},
		"epoch_ms 0":        {Region: "us", Keys: ask("us", 1).Keys},
		"no keys":           {Region: "us", EpochMs: 1},
		"need rate 0":       {Region: "us", EpochMs: 1, Keys: []*quotientv1.AskKey{{PolicyId: "p", Subject: "k:a"}}},
		"both are required": {Region: "us", EpochMs: 1, Keys: []*quotientv1.AskKey{{PolicyId: "p", NeedRateMilli: 1}}},
	}
	for want, a := range asks {
		err := pub.PublishAsk(ctx, a)
		require.ErrorIs(t, err, kafkabus.ErrInvalidTransfer, want)
		assert.Contains(t, err.Error(), want)
	}
	gives := map[string]func(*quotientv1.TransferGive){
		"both are required":   func(g *quotientv1.TransferGive) { g.To = "" },
		"id 0":                func(g *quotientv1.TransferGive) { g.Id = 0 },
		"transfer epoch 0":    func(g *quotientv1.TransferGive) { g.Transfer = 0 },
		"not both 0":          func(g *quotientv1.TransferGive) { g.Keys[0].AmountRateMilli, g.Keys[0].AmountBurstMilli = 0, 0 },
		"amount rate -1":      func(g *quotientv1.TransferGive) { g.Keys[0].AmountRateMilli = -1 },
		"epoch_ms -5":         func(g *quotientv1.TransferGive) { g.EpochMs = -5 },
		"keys[0] is nil":      func(g *quotientv1.TransferGive) { g.Keys[0] = nil },
		"no keys":             func(g *quotientv1.TransferGive) { g.Keys = nil },
		"to itself":           func(g *quotientv1.TransferGive) { g.To = g.From },
		"policy \"\"":         func(g *quotientv1.TransferGive) { g.Keys[0].PolicyId = "" },
		"want both >= 0, not": func(g *quotientv1.TransferGive) { g.Keys[0].AmountBurstMilli = -2 },
	}
	for want, mutate := range gives {
		g := give("us", "eu", 7)
		mutate(g)
		err := pub.PublishGive(ctx, g)
		require.ErrorIs(t, err, kafkabus.ErrInvalidTransfer, want)
		assert.Contains(t, err.Error(), want)
	}
	assert.Zero(t, pub.Stats().PublishedMessages)
}
