package kafkabus

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
)

// TestAssemblerKeyParts: the reports of two key parts of one region with
// the same (epoch, seq) are two senders' reports, each assembled and
// delivered (not a duplicate of the other), keeping their key part; a
// whole report without key parts is a third sender; key parts out of
// range are malformed.
func TestAssemblerKeyParts(t *testing.T) {
	a := newAssembler(8, 4)
	withPart := func(p *quotientv1.UsageReport, kp, kps int32) *quotientv1.UsageReport {
		p.KeyPart, p.KeyParts = kp, kps
		return p
	}
	_, res, _, err := a.add(withPart(part("eu", 1, 1, 0, 2, "a"), 0, 2))
	require.NoError(t, err)
	assert.Equal(t, partKept, res)
	whole, res, _, err := a.add(withPart(part("eu", 1, 1, 0, 1, "c"), 1, 2))
	require.NoError(t, err)
	require.Equal(t, partCompleted, res, "part 1's report is not part 0's")
	assert.EqualValues(t, 1, whole.GetKeyPart())
	whole, res, _, err = a.add(withPart(part("eu", 1, 1, 1, 2, "b"), 0, 2))
	require.NoError(t, err)
	require.Equal(t, partCompleted, res)
	assert.Equal(t, []string{"a", "b"}, subjects(whole))
	assert.EqualValues(t, 0, whole.GetKeyPart())
	assert.EqualValues(t, 2, whole.GetKeyParts())
	_, res, _, err = a.add(part("eu", 1, 1, 0, 1, "x"))
	require.NoError(t, err)
	assert.Equal(t, partCompleted, res, "a report without key parts is its own sender")
	_, res, _, err = a.add(withPart(part("eu", 1, 1, 0, 1, "c"), 1, 2))
	require.NoError(t, err)
	assert.Equal(t, partDuplicate, res)
	for _, kp := range [][2]int32{{2, 2}, {-1, 2}, {0, -1}, {0, maxKeyParts + 1}, {1, 0}} {
		_, _, _, err := a.add(withPart(part("eu", 2, 2, 0, 1, "a"), kp[0], kp[1]))
		assert.ErrorIs(t, err, ErrMalformed, "key part %d of %d", kp[0], kp[1])
	}
}
