package httplimit

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/limiter"
)

// TestPolicyItemsStayBounded: every reload and override brings new
// *Policy values; the header cache keyed by them must not grow for the
// life of the middleware, and what it serves stays right after it is
// emptied.
func TestPolicyItemsStayBounded(t *testing.T) {
	var c policyItems
	for i := range 3 * maxPolicyItems {
		p, err := limiter.ParsePolicy([]byte(fmt.Sprintf(`{"id":"p%d","algorithm":"token_bucket","rate_per_sec":10,"burst":20}`, i)))
		require.NoError(t, err)
		got := c.item(p)
		require.True(t, strings.HasPrefix(got, fmt.Sprintf(`"p%d";`, i)), "item %q", got)
		assert.Equal(t, got, c.item(p), "a cached item is served again")
	}
	n := 0
	c.m.Range(func(any, any) bool { n++; return true })
	assert.LessOrEqual(t, n, maxPolicyItems)
	assert.Positive(t, n)
}
