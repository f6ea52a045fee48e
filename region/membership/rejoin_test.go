package membership_test

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/region/membership"
)

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestRejoinMergesClustersOfOne: replica a starts while b's seed address
// answers nothing (as when a region's replicas all start before the
// service's DNS name has records), so a forms a cluster of one; b then
// starts alone. a's periodic re-join finds b and the two merge, with one
// leader.
func TestRejoinMergesClustersOfOne(t *testing.T) {
	pa, pb := freePort(t), freePort(t)
	self := func(p int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)) }

	ca := membership.DefaultConfig("coord-a")
	ca.BindAddr, ca.BindPort = "127.0.0.1", pa
	ca.Seeds = []string{self(pa), self(pb)} // b is not there yet
	ca.RejoinInterval = 100 * time.Millisecond
	a, err := membership.Join(ca)
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Shutdown() })
	require.Equal(t, []string{"coord-a"}, a.Alive())

	cb := membership.DefaultConfig("coord-b")
	cb.BindAddr, cb.BindPort = "127.0.0.1", pb
	cb.Seeds = []string{self(pb)} // b knows nobody else
	b, err := membership.Join(cb)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Shutdown() })

	waitUntil(t, 10*time.Second, "a and b in one cluster", func() bool {
		return len(a.Alive()) == 2 && len(b.Alive()) == 2
	})
	require.True(t, a.IsLeader())
	require.False(t, b.IsLeader())
}
