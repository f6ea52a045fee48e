package kafkabus_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/rebalancer/kafkabus"
)

// TestPartAdapters: with key parts, each part's adapter publishes its
// reports marked with its part and receives only its part's reports of
// every region (it reads only its part's partitions:
// TestPartAdaptersReadTheirPartition); a report of another part count
// (here a coordinator without parts) is refused and counted by the one
// part whose partitions hold it; a coordinator without parts (NewAdapter)
// reads every partition, refuses the parts' reports and takes its own, so
// the wire format without parts is unchanged.
func TestPartAdapters(t *testing.T) {
	brokers := startKafka(t)
	b := newBus(t, brokers, nil)
	const epoch = 10 * time.Second
	var ads []*kafkabus.Adapter
	var mu sync.Mutex
	var rejected []error
	for p := range 2 {
		a, err := kafkabus.NewPartAdapter(b, epoch, nil, p, 2)
		require.NoError(t, err)
		a.OnReject = func(err error) { mu.Lock(); rejected = append(rejected, err); mu.Unlock() }
		ads = append(ads, a)
	}
	plain, err := kafkabus.NewAdapter(b, epoch, nil)
	require.NoError(t, err)
	_, err = kafkabus.NewPartAdapter(b, epoch, nil, 2, 2)
	require.ErrorIs(t, err, kafkabus.ErrConfig)

	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	var wg sync.WaitGroup
	for _, a := range append(ads, plain) {
		wg.Go(func() { _ = a.Run(ctx) })
	}
	rep := func(region string, subject string) *rebalancer.Report {
		return &rebalancer.Report{Region: region, Epoch: 7, Seq: 7, Heard: []rebalancer.Heard{{Region: region, Epoch: 7}},
			Keys: []rebalancer.KeyReport{{Key: rebalancer.Key{PolicyID: "g", Subject: subject}, Demand: 1}}}
	}
	// The same (region, epoch, seq) from both parts of eu and us.
	for _, region := range []string{"eu", "us"} {
		for p, a := range ads {
			require.NoError(t, a.Publish(ctx, rep(region, region+"-part-"+string(rune('0'+p)))))
		}
	}
	require.NoError(t, plain.Publish(ctx, rep("ap", "ap-whole")))
	for p, a := range ads {
		got := map[string]bool{}
		for range 2 {
			r, err := a.Receive(ctx)
			require.NoError(t, err)
			got[r.Keys[0].Subject] = true
		}
		assert.Equal(t, map[string]bool{"eu-part-" + string(rune('0'+p)): true, "us-part-" + string(rune('0'+p)): true}, got, "part %d", p)
	}
	r, err := plain.Receive(ctx)
	require.NoError(t, err)
	assert.Equal(t, "ap-whole", r.Keys[0].Subject, "the coordinator without parts takes only the report without parts")
	// The part whose partitions hold ap's report refuses it (two parts on
	// three partitions: part 0 reads 0 and 2, part 1 reads 1); plain
	// refuses the four.
	deadline := time.Now().Add(wait)
	for plain.Stats().PartsMismatch < 4 || ads[0].Stats().PartsMismatch+ads[1].Stats().PartsMismatch < 1 {
		require.True(t, time.Now().Before(deadline), "mismatches counted: %+v %+v %+v %+v", plain.Stats(), ads[0].Stats(), ads[1].Stats(), b.Stats())
		time.Sleep(10 * time.Millisecond) // polling a counter with a deadline
	}
	assert.EqualValues(t, 1, ads[0].Stats().PartsMismatch+ads[1].Stats().PartsMismatch, "ap's report is refused by one part")
	for _, a := range ads {
		st := a.Stats()
		assert.EqualValues(t, 2, st.Delivered)
		assert.Zero(t, st.OtherPart, "the other part's reports are not read")
	}
	assert.Zero(t, b.Stats().SkippedParts, "each part has a partition of its own: nothing to skip")
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, rejected)
	for _, err := range rejected {
		assert.True(t, errors.Is(err, kafkabus.ErrPartsMismatch), "%v", err)
	}
}
