package main

import (
	"bytes"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openListeners opens the metrics listener, then the main one, prints
// both addresses, and on a failure names the flag and leaves nothing
// open.
func TestOpenListeners(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	busy := taken.Addr().String()
	// free returns a loopback address nobody listens on now.
	free := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := l.Addr().String()
		require.NoError(t, l.Close())
		return addr
	}

	var out bytes.Buffer
	ln, mln, err := openListeners(&out, "rls", "127.0.0.1:0", "127.0.0.1:0")
	require.NoError(t, err)
	assert.Equal(t, "quotient rls: metrics on "+mln.Addr().String()+"\nquotient rls: listening on "+ln.Addr().String()+"\n", out.String())
	require.NoError(t, ln.Close())
	require.NoError(t, mln.Close())

	out.Reset()
	ln, mln, err = openListeners(&out, "gateway", "127.0.0.1:0", "")
	require.NoError(t, err)
	assert.Nil(t, mln)
	assert.Equal(t, "quotient gateway: listening on "+ln.Addr().String()+"\n", out.String())
	require.NoError(t, ln.Close())

	out.Reset()
	metrics := free()
	_, _, err = openListeners(&out, "gateway", busy, metrics)
	require.ErrorContains(t, err, "--listen: ")
	assert.Empty(t, out.String())
	again, err := net.Listen("tcp", metrics)
	require.NoError(t, err, "the metrics listener was closed")
	require.NoError(t, again.Close())

	main := free()
	_, _, err = openListeners(&out, "rls", main, busy)
	require.ErrorContains(t, err, "--metrics-listen: ")
	assert.Empty(t, out.String())
	again, err = net.Listen("tcp", main)
	require.NoError(t, err, "the main listener was not opened")
	require.NoError(t, again.Close())
}
