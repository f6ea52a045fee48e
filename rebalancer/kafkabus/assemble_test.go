package kafkabus

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
)

func part(region string, epoch, seq int64, i, n int32, subjects ...string) *quotientv1.UsageReport {
	p := &quotientv1.UsageReport{Region: region, Epoch: epoch, EpochMs: 10_000, Seq: seq, Part: i, Parts: n}
	for _, s := range subjects {
		p.Keys = append(p.Keys, &quotientv1.KeyUsage{PolicyId: "p", Subject: s, Demand: 1})
	}
	return p
}

func subjects(r *quotientv1.UsageReport) []string {
	var out []string
	for _, k := range r.GetKeys() {
		out = append(out, k.GetSubject())
	}
	return out
}

func TestAssemblerReorderedDuplicatedInterleaved(t *testing.T) {
	a := newAssembler(8, 4)
	steps := []struct {
		in       *quotientv1.UsageReport
		want     addResult
		subjects []string // of the completed report
	}{
		{part("us", 1, 1, 2, 3, "e", "f"), partKept, nil},
		{part("eu", 1, 1, 1, 2, "y"), partKept, nil}, // another region interleaves
		{part("us", 1, 1, 0, 3, "a", "b"), partKept, nil},
		{part("us", 1, 1, 0, 3, "a", "b"), partDuplicate, nil}, // duplicate part while pending
		{part("us", 1, 1, 1, 3, "c", "d"), partCompleted, []string{"a", "b", "c", "d", "e", "f"}},
		{part("us", 1, 1, 1, 3, "c", "d"), partDuplicate, nil}, // part of a delivered report
		{part("eu", 1, 1, 0, 2, "x"), partCompleted, []string{"x", "y"}},
		{part("us", 2, 2, 0, 1, "g"), partCompleted, []string{"g"}},
		{part("us", 2, 2, 0, 1, "g"), partDuplicate, nil}, // replayed single-part report
	}
	for i, s := range steps {
		whole, res, evicted, err := a.add(s.in)
		require.NoError(t, err, "step %d", i)
		require.Equal(t, s.want, res, "step %d", i)
		require.Zero(t, evicted, "step %d", i)
		if s.want == partCompleted {
			require.Equal(t, s.subjects, subjects(whole), "step %d", i)
			assert.Zero(t, whole.GetPart(), "step %d", i)
			assert.Zero(t, whole.GetParts(), "step %d", i)
		} else {
			require.Nil(t, whole, "step %d", i)
		}
	}
}

func TestAssemblerRejectsMalformedParts(t *testing.T) {
	a := newAssembler(8, 4)
	_, _, _, err := a.add(part("us", 1, 1, 0, 3, "a"))
	require.NoError(t, err)
	cases := []struct {
		in   *quotientv1.UsageReport
		want string
	}{
		{part("", 1, 1, 0, 1), "region is empty"},
		{part("us", 1, 1, 0, 0), "parts 0"},
		{part("us", 1, 1, 3, 3), "part 3, want 0..2"},
		{part("us", 1, 1, -1, 3), "part -1"},
		{part("us", 1, 1, 0, maxParts+1), "parts 100001"},
		{part("us", 1, 1, 1, 4), "parts 4, but earlier parts said 3"},
		{part("us", 1, 1, 0, 1), "parts 1, but earlier parts said 3"},
	}
	for _, c := range cases {
		_, _, _, err := a.add(c.in)
		require.ErrorIs(t, err, ErrMalformed)
		assert.Contains(t, err.Error(), c.want)
	}
	// The pending report is unharmed by the rejected parts.
	_, _, _, err = a.add(part("us", 1, 1, 1, 3, "b"))
	require.NoError(t, err)
	whole, res, _, err := a.add(part("us", 1, 1, 2, 3, "c"))
	require.NoError(t, err)
	require.Equal(t, partCompleted, res)
	assert.Equal(t, []string{"a", "b", "c"}, subjects(whole))
}

func TestAssemblerEvictsOldestIncomplete(t *testing.T) {
	a := newAssembler(2, 4)
	for seq := int64(1); seq <= 2; seq++ {
		_, _, evicted, err := a.add(part("us", seq, seq, 0, 2, "a"))
		require.NoError(t, err)
		require.Zero(t, evicted)
	}
	_, _, evicted, err := a.add(part("us", 3, 3, 0, 2, "a"))
	require.NoError(t, err)
	require.Equal(t, 1, evicted, "the third incomplete report evicts the lowest seq")

	// seq 1 was evicted: its second part starts a new, incomplete report.
	_, res, _, err := a.add(part("us", 1, 1, 1, 2, "b"))
	require.NoError(t, err)
	assert.Equal(t, partKept, res)
	// seq 2 and 3 still complete.
	for seq := int64(2); seq <= 3; seq++ {
		_, res, _, err := a.add(part("us", seq, seq, 1, 2, "b"))
		require.NoError(t, err)
		assert.Equal(t, partCompleted, res, "seq %d", seq)
	}
}

func TestAssemblerForgetsOldDeliveries(t *testing.T) {
	a := newAssembler(8, 2)
	for seq := int64(1); seq <= 3; seq++ {
		_, res, _, err := a.add(part("us", seq, seq, 0, 1, "a"))
		require.NoError(t, err)
		require.Equal(t, partCompleted, res)
	}
	// Only the last two deliveries are remembered: seq 1 is delivered again,
	// which is why receivers must dedupe by (region, epoch, seq) themselves.
	_, res, _, err := a.add(part("us", 3, 3, 0, 1, "a"))
	require.NoError(t, err)
	assert.Equal(t, partDuplicate, res)
	_, res, _, err = a.add(part("us", 1, 1, 0, 1, "a"))
	require.NoError(t, err)
	assert.Equal(t, partCompleted, res)
}
