package rebalancer_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go/compress/lz4"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/rebalancer/kafkabus"
	"github.com/quotientlabs/quotient/shares"
)

// BenchmarkDeltaSteady100k: three regions' Cores, 100,000 active global
// keys, demand steady (each key's the same every epoch), after 70 epochs
// (the shares settled: with deltas, demand within the tolerance of the
// base is published at the base's value, so shares settle by one step per
// full report, in about 60 epochs here, against 15 without); one
// iteration is one epoch. 99% of the keys are under their limit (every
// region's demand below its default share), 1% contended (policy "h"). Reports go through the wire form
// (kafkabus.ToProto, proto.Marshal; proto.Unmarshal, kafkabus.FromProto).
// It reports the bytes per key per epoch of region a's reports, as
// protobuf (raw-B/key/epoch) and lz4-compressed as the bus's producer
// compresses them (B/key/epoch; one frame per report, where the bus
// compresses batches of up to a MiB), full reports every FullEvery-th
// epoch included,
// and the time region a takes to decode and Receive the two other
// regions' reports and Decide: the receiver's cost per epoch. Pure
// in-memory work, no Redis nor broker: run it under flock.
func BenchmarkDeltaSteady100k(b *testing.B) {
	for _, deltas := range []bool{false, true} {
		b.Run(fmt.Sprintf("deltas=%v", deltas), func(b *testing.B) { benchDeltaSteady(b, 100_000, deltas) })
	}
}

func benchDeltaSteady(b *testing.B, nkeys int, deltas bool) {
	const epoch = 10 * time.Second
	names := []string{"a", "b", "c"}
	lim := shares.Limit{RateMilli: 300_000, BurstMilli: 600_000, Regions: 3}
	hot := shares.Limit{RateMilli: 3_000, BurstMilli: 6_000, Regions: 3}
	cores := make([]*rebalancer.Core, len(names))
	for i, n := range names {
		cfg := rebalancer.DefaultConfig()
		cfg.Region, cfg.Regions, cfg.Epoch = n, names, epoch
		cfg.Deltas = deltas
		c, err := rebalancer.New(cfg, rebalancer.PolicyMap{"g": lim, "h": hot})
		require.NoError(b, err)
		require.NoError(b, c.StartFresh())
		cores[i] = c
	}
	usage := make([][]rebalancer.Usage, len(names))
	for r := range names {
		for k := range nkeys {
			// Region a busy on a third of the keys, every region on some.
			d := int64(10 + (k+r)%7)
			if k%3 == r {
				d *= 20
			}
			pol := "g"
			if k%100 == 0 {
				pol = "h"
			}
			usage[r] = append(usage[r], rebalancer.Usage{Key: rebalancer.Key{PolicyID: pol, Subject: fmt.Sprintf("k:%07d", k)}, Demand: d, Admitted: d})
		}
	}
	m := rebalancer.EpochOf(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), epoch)
	var bytesA, rawA int64
	var recv, decide time.Duration
	var unbased int64
	step := func(measure bool) {
		now := rebalancer.EpochStart(m+1, epoch).Add(time.Second)
		wire := make([][]byte, len(names))
		for i, c := range cores {
			pub, err := c.Collect(now, usage[i])
			require.NoError(b, err)
			require.NotNil(b, pub.Report)
			v, err := proto.Marshal(kafkabus.ToProto(pub.Report, epoch, now))
			require.NoError(b, err)
			wire[i] = v
		}
		if measure {
			rawA += int64(len(wire[0]))
			var buf bytes.Buffer
			w := (&lz4.Codec{}).NewWriter(&buf)
			_, err := w.Write(wire[0])
			require.NoError(b, err)
			require.NoError(b, w.Close())
			bytesA += int64(buf.Len())
		}
		for i, c := range cores {
			t0 := time.Now()
			for j := range cores {
				if j == i {
					continue
				}
				var p quotientv1.UsageReport
				require.NoError(b, proto.Unmarshal(wire[j], &p))
				r, err := kafkabus.FromProto(&p, epoch)
				require.NoError(b, err)
				_, err = c.ReceiveAt(now, r)
				require.NoError(b, err)
			}
			t1 := time.Now()
			_, err := c.Decide(now.Add(time.Second))
			require.NoError(b, err)
			if i == 0 && measure {
				recv += t1.Sub(t0)
				decide += time.Since(t1)
			}
		}
		m++
	}
	// Until the shares settled (and a full report went out after it).
	for range 70 {
		step(false)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		step(true)
	}
	b.StopTimer()
	for _, c := range cores {
		unbased += c.Stats().Unbased
	}
	b.ReportMetric(float64(bytesA)/float64(b.N)/float64(nkeys), "B/key/epoch")
	b.ReportMetric(float64(rawA)/float64(b.N)/float64(nkeys), "raw-B/key/epoch")
	b.ReportMetric(float64((recv+decide).Milliseconds())/float64(b.N), "ms-recv+decide/epoch")
	b.ReportMetric(float64(recv.Milliseconds())/float64(b.N), "ms-recv/epoch")
	b.ReportMetric(float64(decide.Milliseconds())/float64(b.N), "ms-decide/epoch")
	b.ReportMetric(float64(unbased), "unbased")
}
