package kafkabus

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/shares"
)

// randomKey returns a KeyUsage whose fields are each zero, small, large,
// negative or extreme, with strings empty, ASCII or not.
func randomKey(rng *rand.Rand) *quotientv1.KeyUsage {
	ints := func() int64 {
		switch rng.IntN(6) {
		case 0:
			return 0
		case 1:
			return rng.Int64N(128)
		case 2:
			return rng.Int64N(1 << 46)
		case 3:
			return -rng.Int64N(1 << 40)
		case 4:
			return math.MaxInt64
		}
		return math.MinInt64
	}
	strs := []string{"", "p", "api", "acct-000042", "sübject/✓", string(make([]byte, 200))}
	return &quotientv1.KeyUsage{
		PolicyId: strs[rng.IntN(len(strs))], Subject: strs[rng.IntN(len(strs))],
		Demand: ints(), Admitted: ints(), SmoothedDemandMilli: ints(),
		ShareRateMilli: ints(), ShareBurstMilli: ints(), WantRateMilli: ints(), WantBurstMilli: ints(),
		Removed: rng.IntN(2) == 0,
	}
}

// TestKeyUsageCodec: the hand encoder writes exactly proto.Marshal's bytes
// and size for every key, from the wire form and from the rebalancer's
// (through ToProto), and refuses invalid UTF-8 as proto.Marshal does.
func TestKeyUsageCodec(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 5000 {
		k := randomKey(rng)
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(k)
		require.NoError(t, err)
		f := fieldsOfProto(k)
		got, err := f.append(nil)
		require.NoError(t, err)
		require.Equal(t, want, got, "key %d: %v", i, k)
		require.Equal(t, len(want), f.size(), "key %d: %v", i, k)
		// The same key as the rebalancer holds it, as ToProto converts it.
		kr := rebalancer.KeyReport{Key: rebalancer.Key{PolicyID: k.PolicyId, Subject: k.Subject},
			Demand: k.Demand, Admitted: k.Admitted, SmoothedDemandMilli: k.SmoothedDemandMilli,
			Share: shares.Share{RateMilli: k.ShareRateMilli, BurstMilli: k.ShareBurstMilli},
			Want:  shares.Share{RateMilli: k.WantRateMilli, BurstMilli: k.WantBurstMilli}, Removed: k.Removed}
		conv := ToProto(&rebalancer.Report{Keys: []rebalancer.KeyReport{kr}}, time.Second, time.Time{}).Keys[0]
		require.True(t, proto.Equal(k, conv))
		assert.Equal(t, f, fieldsOfReport(&kr), "key %d", i)
	}
	empty, err := (&keyFields{}).append(nil)
	require.NoError(t, err)
	assert.Empty(t, empty)
	for _, k := range []*quotientv1.KeyUsage{{PolicyId: "p\xff"}, {Subject: "s\xc3"}} {
		_, perr := proto.Marshal(k)
		require.Error(t, perr, "proto refuses it too")
		f := fieldsOfProto(k)
		_, err := f.append(nil)
		assert.ErrorContains(t, err, "invalid UTF-8")
	}
}

// TestAdapterEncodesAsBus: the adapter's encoding of a rebalancer report
// straight from its keys is, message for message, the bytes Bus.Publish
// makes of ToProto's conversion, split into the same parts.
func TestAdapterEncodesAsBus(t *testing.T) {
	b := &Bus{cfg: DefaultConfig()}
	b.cfg.MaxMessageBytes = 4096
	fixed := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b.cfg.Now = func() time.Time { return fixed }
	require.NoError(t, b.cfg.Validate())
	rng := rand.New(rand.NewPCG(7, 8))
	r := &rebalancer.Report{Region: "eu", Epoch: 9, Seq: 9, Started: 2, AcceptsDelta: true, Base: 6,
		Heard: []rebalancer.Heard{{Region: "eu", Epoch: 9}, {Region: "us", Epoch: 8}}}
	for i := range 700 {
		k := randomKey(rng)
		r.Keys = append(r.Keys, rebalancer.KeyReport{Key: rebalancer.Key{PolicyID: "p", Subject: fmt.Sprintf("s-%04d", i)},
			Demand: k.Demand, Admitted: k.Admitted, SmoothedDemandMilli: k.SmoothedDemandMilli,
			Share: shares.Share{RateMilli: k.ShareRateMilli, BurstMilli: k.ShareBurstMilli},
			Want:  shares.Share{RateMilli: k.WantRateMilli, BurstMilli: k.WantBurstMilli}, Removed: k.Removed})
	}
	want, err := b.encode(ToProto(r, 10*time.Second, fixed))
	require.NoError(t, err)
	head := *r
	head.Keys = nil
	got, err := b.encodeKeys(ToProto(&head, 10*time.Second, fixed), reportKeys(r.Keys))
	require.NoError(t, err)
	require.Greater(t, len(want), 3, "split into parts")
	require.Equal(t, want, got)
}

// TestEncodeByHand: a report encoded with the hand encoder, in parts,
// decodes to the report sent (header and keys, in order); a report with a
// key carrying unknown fields goes through proto.Marshal and keeps them;
// invalid UTF-8 in a key is refused.
func TestEncodeByHand(t *testing.T) {
	b := &Bus{cfg: DefaultConfig()}
	b.cfg.MaxMessageBytes = 8192
	require.NoError(t, b.cfg.Validate())
	rng := rand.New(rand.NewPCG(3, 4))
	r := &quotientv1.UsageReport{Region: "eu", Epoch: 7, EpochMs: 10_000, Seq: 7, SentUnixMs: 123, StartedEpoch: 3,
		Heard:   []*quotientv1.RegionHeard{{Region: "us", LastEpoch: 6}},
		Relayed: []*quotientv1.RelayedHeard{{Region: "us", Epoch: 6, Heard: []*quotientv1.RegionHeard{{Region: "eu", LastEpoch: 5}}}},
		KeyPart: 1, KeyParts: 2, AcceptsDelta: true,
	}
	for range 2000 {
		k := randomKey(rng)
		k.PolicyId = "p" // keys must not be too large for a part
		r.Keys = append(r.Keys, k)
	}
	decode := func(r *quotientv1.UsageReport) []*quotientv1.UsageReport {
		msgs, err := b.encode(r)
		require.NoError(t, err)
		var parts []*quotientv1.UsageReport
		for _, m := range msgs {
			require.LessOrEqual(t, len(m.Value)+len(m.Key)+recordOverhead, b.cfg.MaxMessageBytes)
			p := &quotientv1.UsageReport{}
			require.NoError(t, proto.Unmarshal(m.Value, p))
			parts = append(parts, p)
		}
		return parts
	}
	parts := decode(r)
	require.Greater(t, len(parts), 5, "split into parts")
	var keys []*quotientv1.KeyUsage
	for i, p := range parts {
		assert.Equal(t, int32(i), p.GetPart())
		assert.Equal(t, int32(len(parts)), p.GetParts())
		keys = append(keys, p.GetKeys()...)
		head := proto.Clone(r).(*quotientv1.UsageReport)
		head.Keys, head.Part, head.Parts = nil, p.GetPart(), p.GetParts()
		p.Keys = nil
		assert.True(t, proto.Equal(head, p), "part %d header: %v", i, p)
	}
	require.Len(t, keys, len(r.Keys))
	for i := range keys {
		require.True(t, proto.Equal(r.Keys[i], keys[i]), "key %d: sent %v, got %v", i, r.Keys[i], keys[i])
	}

	// A key decoded from a newer sender: its unknown field is kept.
	odd := &quotientv1.KeyUsage{PolicyId: "p", Subject: "odd", Demand: 1}
	odd.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 5))
	small := &quotientv1.UsageReport{Region: "eu", Epoch: 7, EpochMs: 10_000, Seq: 7, Keys: []*quotientv1.KeyUsage{r.Keys[0], odd}}
	got := decode(small)
	require.Len(t, got, 1)
	require.Len(t, got[0].GetKeys(), 2)
	assert.True(t, proto.Equal(odd, got[0].GetKeys()[1]), "unknown field kept: %v", got[0].GetKeys()[1])

	bad := &quotientv1.UsageReport{Region: "eu", Epoch: 7, EpochMs: 10_000, Seq: 7, Keys: []*quotientv1.KeyUsage{{PolicyId: "p", Subject: "s\xff"}}}
	_, err := b.encode(bad)
	assert.ErrorIs(t, err, ErrInvalidReport)
	assert.ErrorContains(t, err, "invalid UTF-8")
}

// BenchmarkEncode100kKeys: what Adapter.Publish does before sending a
// full report of 100,000 keys shaped as the coordinator's: convert and
// encode (size, split, marshal), in one run three ways: as before
// keycodec.go (ToProto, then proto.Marshal: "proto"), ToProto then the
// hand encoder ("hand"), and the hand encoder straight from the report
// ("report", what the adapter does).
func BenchmarkEncode100kKeys(b *testing.B) {
	bus := &Bus{cfg: DefaultConfig()}
	require.NoError(b, bus.cfg.Validate())
	r := &rebalancer.Report{Region: "eu", Epoch: 7, Seq: 7, Heard: []rebalancer.Heard{{Region: "eu", Epoch: 7}}}
	for i := range 100_000 {
		r.Keys = append(r.Keys, rebalancer.KeyReport{Key: rebalancer.Key{PolicyID: "api", Subject: "acct-" + strconv.Itoa(100_000+i)},
			Demand: int64(i % 500), Admitted: int64(i % 400), SmoothedDemandMilli: int64(i%500) * 100,
			Share: shares.Share{RateMilli: 100_000, BurstMilli: 200_000}})
	}
	head := *r
	head.Keys = nil
	for _, mode := range []string{"proto", "hand", "report"} {
		b.Run(mode, func(b *testing.B) {
			bus.protoKeys = mode == "proto"
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if mode == "report" {
					_, err = bus.encodeKeys(ToProto(&head, 10*time.Second, time.Time{}), reportKeys(r.Keys))
				} else {
					_, err = bus.encode(ToProto(r, 10*time.Second, time.Time{}))
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/100_000, "ns/key")
		})
	}
}
