package membership_test

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/region/membership"
)

// TestOwnedParts: every part has exactly one owner among the live members,
// the same whatever the order of the view; a member that leaves moves only
// its own parts, and one that joins takes only parts (it does not move
// parts between the others); parts spread over the members.
func TestOwnedParts(t *testing.T) {
	const parts = 64
	alive := []string{"eu-a", "eu-b", "eu-c", "eu-d"}
	owner := map[int]string{}
	count := map[string]int{}
	for _, n := range alive {
		for _, p := range membership.OwnedParts(alive, n, parts) {
			_, dup := owner[p]
			require.False(t, dup, "part %d owned twice", p)
			owner[p] = n
			count[n]++
		}
	}
	require.Len(t, owner, parts, "every part owned")
	for _, n := range alive {
		assert.Greater(t, count[n], parts/8, "%s owns a fair share: %v", n, count)
	}
	rev := slices.Clone(alive)
	slices.Reverse(rev)
	for p := range parts {
		assert.Equal(t, owner[p], membership.OwnerOf(rev, p), "part %d: the view's order does not matter", p)
	}
	// eu-b leaves: only its parts move.
	left := []string{"eu-a", "eu-c", "eu-d"}
	for p := range parts {
		if owner[p] != "eu-b" {
			assert.Equal(t, owner[p], membership.OwnerOf(left, p), "part %d moved although its owner stayed", p)
		} else {
			assert.NotEqual(t, "eu-b", membership.OwnerOf(left, p))
		}
	}
	// eu-e joins: a part moves only to eu-e.
	joined := append(slices.Clone(alive), "eu-e")
	for p := range parts {
		if o := membership.OwnerOf(joined, p); o != owner[p] {
			assert.Equal(t, "eu-e", o, "part %d", p)
		}
	}
	assert.Empty(t, membership.OwnerOf(nil, 0))
	assert.Empty(t, membership.OwnedParts(alive, "eu-z", parts))
	// One part: the owner is one of the members.
	assert.Contains(t, alive, membership.OwnerOf(alive, 0))
}
