package kafkabus_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/quotientlabs/quotient/internal/kafkautil"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/rebalancer/kafkabus"
)

// TestPartAdaptersReadTheirPartition: a part's report goes to partition
// PartitionOf(part, n) with the KeyPartHeader, a report without parts to
// its key's hash partition, and each part's adapter fetches only its
// part's partition (plus, with more partitions than parts, those no part
// uses), receives exactly its part's reports of every region, skips
// undecoded the messages of parts that share its partition, and refuses
// the reports of senders without parts that land on what it reads; each
// of those is refused by exactly one part when the topic has at least as
// many partitions as parts (at least one otherwise). The fetches are
// recorded at the broker (a kfake control function on Fetch requests);
// each part's consumer is told apart by its fetch size (its bus's
// MaxMessageBytes, which sets the readers' MaxBytes), so that all parts
// consume at once, as on a replica.
func TestPartAdaptersReadTheirPartition(t *testing.T) {
	for _, tc := range []struct {
		name              string
		parts, partitions int
		reads             [][]int // the partitions each part reads
	}{
		{"a partition per part", 4, 4, [][]int{{0}, {1}, {2}, {3}}},
		{"an older topic with fewer partitions", 4, 3, [][]int{{0}, {1}, {2}, {0}}},
		{"more partitions than parts", 2, 3, [][]int{{0, 2}, {1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testPartRead(t, tc.parts, tc.partitions, tc.reads)
		})
	}
}

func testPartRead(t *testing.T, parts, partitions int, reads [][]int) {
	const (
		epoch = 10 * time.Second
		// A part's consumer fetches up to 4 x its MaxMessageBytes (plus a
		// few bytes of kafka-go's): part p's bus has baseBytes + stepBytes p.
		baseBytes, stepBytes = 100_000, 1000
	)
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	t.Cleanup(kc.Close)
	brokers := kc.ListenAddrs()
	var mu sync.Mutex
	fetched := make([]map[int]bool, parts) // by part: partitions named in its fetches
	for p := range fetched {
		fetched[p] = map[int]bool{}
	}
	var otherTopics []string
	kc.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		fr := req.(*kmsg.FetchRequest)
		p := (int(fr.MaxBytes) - 4*baseBytes) / (4 * stepBytes)
		if int(fr.MaxBytes) < 4*baseBytes || p >= parts {
			return nil, nil, false // not a part's consumer (the placement check's)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, ft := range fr.Topics {
			if ft.Topic != kafkabus.DefaultTopic {
				otherTopics = append(otherTopics, ft.Topic)
			}
			for _, fp := range ft.Partitions {
				fetched[p][int(fp.Partition)] = true
			}
		}
		return nil, nil, false
	})

	pub := newBus(t, brokers, func(c *kafkabus.Config) { c.Partitions = partitions })
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	rep := func(region, subject string) *rebalancer.Report {
		return &rebalancer.Report{Region: region, Epoch: 7, Seq: 7, Heard: []rebalancer.Heard{{Region: region, Epoch: 7}},
			Keys: []rebalancer.KeyReport{{Key: rebalancer.Key{PolicyID: "g", Subject: subject}, Demand: 1}}}
	}
	for _, region := range []string{"eu", "us"} {
		for p := range parts {
			a, err := kafkabus.NewPartAdapter(pub, epoch, nil, p, parts)
			require.NoError(t, err)
			require.NoError(t, a.Publish(ctx, rep(region, fmt.Sprintf("%s-%d", region, p))))
		}
	}
	// Senders without parts, one landing on each partition (by their
	// key's hash), published last: on every partition a part reads, its
	// report of a sender without parts comes after the parts' messages.
	ids := make([]int, partitions)
	for i := range ids {
		ids[i] = i
	}
	hashOf := func(key string) int { return kafka.Murmur2Balancer{}.Balance(kafka.Message{Key: []byte(key)}, ids...) }
	plainOn := map[int]string{} // partition -> sender
	for i := 0; len(plainOn) < partitions; i++ {
		name := fmt.Sprintf("plain-%d", i)
		if _, ok := plainOn[hashOf(name)]; !ok {
			plainOn[hashOf(name)] = name
		}
	}
	plain, err := kafkabus.NewAdapter(pub, epoch, nil)
	require.NoError(t, err)
	for q := range partitions {
		require.NoError(t, plain.Publish(ctx, rep(plainOn[q], "whole")))
	}

	// Placement, as on the wire.
	cl, err := kafkautil.New(kafkautil.DefaultConfig(brokers...))
	require.NoError(t, err)
	defer func() { _ = cl.Close() }()
	total := 2*parts + partitions
	seen := 0
	pctx, pcancel := context.WithCancel(ctx)
	err = kafkautil.ConsumeTopics(pctx, cl, kafkautil.ConsumeConfig{Topics: []string{kafkabus.DefaultTopic}},
		func(_ context.Context, _ string, partition int, m kafka.Message) error {
			var hdr []string
			for _, h := range m.Headers {
				if h.Key == kafkabus.KeyPartHeader {
					hdr = append(hdr, string(h.Value))
				}
			}
			key := string(m.Key)
			if i := len(key) - 2; i > 0 && key[i] == '/' {
				kp, err := strconv.Atoi(key[i+1:])
				require.NoError(t, err)
				assert.Equal(t, []string{strconv.Itoa(kp)}, hdr, "key %s carries its part in the header", key)
				assert.Equal(t, kafkabus.PartitionOf(kp, partitions), partition, "key %s on its part's partition", key)
			} else {
				assert.Empty(t, hdr, "key %s: no key part header without parts", key)
				assert.Equal(t, hashOf(key), partition, "key %s on its hash partition", key)
			}
			if seen++; seen == total {
				pcancel()
			}
			return nil
		})
	pcancel()
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, total, seen, "every message read")

	// The parts' consumers, all at once.
	type consumer struct {
		bus      *kafkabus.Bus
		ad       *kafkabus.Adapter
		rejected chan error
	}
	cs := make([]consumer, parts)
	rctx, rcancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for p := range parts {
		b := newBus(t, brokers, func(c *kafkabus.Config) {
			c.MaxMessageBytes, c.SkipCreateTopic = baseBytes+stepBytes*p, true
		})
		a, err := kafkabus.NewPartAdapter(b, epoch, nil, p, parts)
		require.NoError(t, err)
		rej := make(chan error, 2*partitions)
		a.OnReject = func(err error) { rej <- err }
		cs[p] = consumer{b, a, rej}
		wg.Go(func() { assert.ErrorIs(t, a.Run(rctx), context.Canceled) })
	}
	refusedBy := map[string]int{} // sender without parts -> parts that refused it
	for p, c := range cs {
		got := map[string]bool{}
		for range 2 {
			r, err := c.ad.Receive(ctx)
			require.NoError(t, err, "part %d", p)
			require.Len(t, r.Keys, 1)
			got[r.Keys[0].Subject] = true
		}
		assert.Equal(t, map[string]bool{fmt.Sprintf("eu-%d", p): true, fmt.Sprintf("us-%d", p): true}, got, "part %d receives its part's reports", p)
		for _, q := range reads[p] {
			select {
			case err := <-c.rejected:
				assert.True(t, errors.Is(err, kafkabus.ErrPartsMismatch), "part %d: %v", p, err)
				refusedBy[plainOn[q]]++
			case <-ctx.Done():
				t.Fatalf("part %d: the report without parts on partition %d not refused", p, q)
			}
		}
	}
	rcancel()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, otherTopics)
	for p, c := range cs {
		want := map[int]bool{}
		for _, q := range reads[p] {
			want[q] = true
		}
		assert.Equal(t, want, fetched[p], "part %d fetches only its partitions", p)
		assert.Empty(t, c.rejected, "part %d refused more than the reports on its partitions", p)
		st := c.ad.Stats()
		assert.EqualValues(t, 2, st.Delivered, "part %d", p)
		assert.EqualValues(t, len(reads[p]), st.PartsMismatch, "part %d", p)
		assert.Zero(t, st.OtherPart, "part %d: other parts' messages are skipped undecoded", p)
		// The messages of parts that share this part's partition, skipped
		// by their key (all read: a report without parts follows them).
		shared := 0
		for q := range parts {
			if q != p && kafkabus.PartitionOf(q, partitions) == kafkabus.PartitionOf(p, partitions) {
				shared += 2
			}
		}
		assert.EqualValues(t, shared, c.bus.Stats().SkippedParts, "part %d", p)
	}
	for q, name := range plainOn {
		if partitions >= parts {
			assert.Equal(t, 1, refusedBy[name], "the report without parts on partition %d refused by exactly one part", q)
		} else {
			assert.GreaterOrEqual(t, refusedBy[name], 1, "the report without parts on partition %d refused", q)
		}
	}
}
