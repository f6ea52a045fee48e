package kafkabus

import (
	"fmt"
	"testing"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
)

// TestPartPartitions: for every part count and partition count, each part
// reads its own partition (PartitionOf), every partition is read by at
// least one part, by exactly one when there are at least as many
// partitions as parts, and a part reads only its own partition when the
// counts are equal.
func TestPartPartitions(t *testing.T) {
	assert.Equal(t, 3, PartitionOf(3, 4))
	assert.Equal(t, 0, PartitionOf(3, 3))
	assert.Equal(t, 1, PartitionOf(5, 4))
	assert.Panics(t, func() { PartitionOf(1, 0) })
	assert.Panics(t, func() { PartitionOf(-1, 3) })
	for parts := 1; parts <= 9; parts++ {
		for n := 1; n <= 12; n++ {
			readers := make([]int, n)
			for p := range parts {
				got := partPartitions(p, parts, n)
				require.NotEmpty(t, got)
				assert.Equal(t, PartitionOf(p, n), got[0], "parts %d partitions %d part %d", parts, n, p)
				assert.IsIncreasing(t, got)
				for _, q := range got {
					require.True(t, q >= 0 && q < n)
					readers[q]++
				}
				if n == parts {
					assert.Equal(t, []int{p}, got)
				}
			}
			for q, r := range readers {
				if n >= parts {
					assert.Equal(t, 1, r, "parts %d partitions %d: readers of partition %d", parts, n, q)
				} else {
					assert.GreaterOrEqual(t, r, 1, "parts %d partitions %d: readers of partition %d", parts, n, q)
				}
			}
		}
	}
}

// TestPartBalancer: a message with the key part header goes to its part's
// partition whatever its key; one without it, or with a header that is not
// a key part, is placed by the fallback (the key's hash, as before).
func TestPartBalancer(t *testing.T) {
	b := partBalancer{fallback: kafka.Murmur2Balancer{}}
	ids := []int{0, 1, 2}
	for kp := range 7 {
		m := kafka.Message{Key: fmt.Appendf(nil, "eu/%d", kp), Headers: keyPartHeaders(int32(kp), 7)}
		assert.Equal(t, kp%3, b.Balance(m, ids...), "key part %d", kp)
	}
	for _, key := range []string{"eu", "us", "ap-southeast", "x/1"} {
		want := kafka.Murmur2Balancer{}.Balance(kafka.Message{Key: []byte(key)}, ids...)
		assert.Equal(t, want, b.Balance(kafka.Message{Key: []byte(key)}, ids...), key)
		for _, v := range []string{"", "x", "-1", "4096", "99999999999999999999"} {
			bad := kafka.Message{Key: []byte(key), Headers: []kafka.Header{{Key: KeyPartHeader, Value: []byte(v)}}}
			assert.Equal(t, want, b.Balance(bad, ids...), "%s with header %q", key, v)
		}
	}
	assert.Nil(t, keyPartHeaders(0, 1), "no header without parts")
	assert.Nil(t, keyPartHeaders(0, 0), "no header without parts")
	assert.Equal(t, []kafka.Header{{Key: KeyPartHeader, Value: []byte("12")}}, keyPartHeaders(12, 16))
}

// TestPartKeyFilter: a part's consumer skips only the messages of another
// of its own parts; its own, those without a part and those of parts
// beyond its count (another part count, to be refused) are decoded.
func TestPartKeyFilter(t *testing.T) {
	keep := partKeyFilter(1, 4)
	for key, want := range map[string]bool{
		"eu/1": true, "eu/0": false, "eu/3": false, "us/2": false,
		"eu": true, "eu/": true, "eu/x": true, "a/b/1": true, "a/b/2": false,
		"eu/4": true, "eu/7": true, "eu/99999999999": true,
	} {
		assert.Equal(t, want, keep([]byte(key)), key)
	}
}

// TestEncodeKeyPartHeader: every message of a report with key parts
// carries the key part header (and the part in its key); a report without
// parts carries none.
func TestEncodeKeyPartHeader(t *testing.T) {
	b := &Bus{cfg: DefaultConfig()}
	b.cfg.MaxMessageBytes = 4096
	require.NoError(t, b.cfg.Validate())
	whole := func(keys int) *quotientv1.UsageReport {
		r := &quotientv1.UsageReport{Region: "eu", Epoch: 1, EpochMs: 10_000, Seq: 1}
		for i := range keys {
			r.Keys = append(r.Keys, &quotientv1.KeyUsage{PolicyId: "p", Subject: fmt.Sprintf("subject-%04d", i), Demand: 1})
		}
		return r
	}
	r := whole(500)
	r.KeyPart, r.KeyParts = 2, 4
	msgs, err := b.encode(r)
	require.NoError(t, err)
	require.Greater(t, len(msgs), 1, "a split report")
	for _, m := range msgs {
		assert.Equal(t, "eu/2", string(m.Key))
		assert.Equal(t, keyPartHeaders(2, 4), m.Headers)
	}
	msgs, err = b.encode(whole(10))
	require.NoError(t, err)
	for _, m := range msgs {
		assert.Equal(t, "eu", string(m.Key))
		assert.Empty(t, m.Headers)
	}
}
