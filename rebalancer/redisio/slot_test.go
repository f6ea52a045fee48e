package redisio

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

// TestKeySlotMatchesRedis: keySlot agrees with CLUSTER KEYSLOT of a real
// cluster node, with and without hash tags (empty and unclosed ones too).
func TestKeySlotMatchesRedis(t *testing.T) {
	c := redistest.StartCluster(t).Client()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	keys := []string{"", "a", "123456789", "rl:{k:abc}:g:share", "rl:{k:a%20b}:policy-1:share",
		"{}x", "x{", "x{y", "{a}{b}", "rl:{u:" + string(rune(0xe9)) + "}:g:share"}
	for i := range 200 {
		keys = append(keys, "rl:{k:key-"+string(rune('a'+i%26))+string(rune('A'+i/26))+"}:g:share")
	}
	for _, k := range keys {
		want, err := c.ClusterKeySlot(ctx, k).Result()
		require.NoError(t, err, k)
		assert.Equal(t, uint16(want), keySlot(k), "key %q", k)
	}
}
