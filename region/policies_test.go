package region

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/region/admin"
)

// TestPolicySetPrecedence: the file's policies are in force until the log
// holds a record, then the log's alone; the limits follow, and a change of
// the replicated fixed windows is signalled once.
func TestPolicySetPrecedence(t *testing.T) {
	file, err := limiter.ParsePolicies([]byte(`[{"id":"f","algorithm":"token_bucket","rate_per_sec":10,"scope":"global"}]`))
	require.NoError(t, err)
	cat := admin.NewCatalog()
	ps := newPolicySet(file, cat, 2)
	<-ps.changed // the first refresh
	l, ok := ps.Limit("f")
	require.True(t, ok, "the file is the bootstrap set")
	assert.Equal(t, int64(10_000), l.RateMilli)
	assert.False(t, ps.fromLog())

	doc := `{"id":"d","version":1,"algorithm":"fixed_window","limit":100,"window_s":86400,"scope":"global"}`
	_, err = cat.Apply(admin.Record{Kind: admin.KindPolicy, ID: "d", Version: 1, Document: []byte(doc), Author: "ops", UnixMs: 1})
	require.NoError(t, err)
	ps.refresh()
	assert.True(t, ps.fromLog())
	_, ok = ps.Limit("f")
	assert.False(t, ok, "the log replaces the file entirely")
	require.Len(t, ps.windowPolicies(), 1)
	select {
	case <-ps.changed:
	default:
		t.Fatal("a new fixed window is a change")
	}
	ps.refresh()
	select {
	case <-ps.changed:
		t.Fatal("no change, no signal")
	default:
	}
}
