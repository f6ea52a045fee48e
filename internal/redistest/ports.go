package redistest

import (
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

const (
	// clusterBusOffset is the distance from a cluster node's port to its
	// cluster bus port (fixed by Redis unless cluster-port is set).
	clusterBusOffset = 10000
	// lowestPort is the lowest port this package hands out.
	lowestPort = 10000
)

// portPicker picks random loopback ports below the kernel's ephemeral range,
// so that outgoing connections (which take ephemeral ports) never collide
// with them, and checks that each is free by binding it. A port can still be
// taken between the check and redis-server's bind; callers retry.
type portPicker struct {
	mu  sync.Mutex
	rnd *mrand.Rand
	// hi is the highest port for a standalone server (exclusive bound of
	// the random draw is hi+1).
	hi int
}

func newPortPicker() *portPicker {
	var seed [32]byte
	_, _ = rand.Read(seed[:])
	return &portPicker{rnd: mrand.New(mrand.NewChaCha8(seed)), hi: ephemeralLow() - 1}
}

// ephemeralLow reads the lowest ephemeral port of the kernel (Linux), or
// returns the Linux default 32768.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if lo, err := strconv.Atoi(f[0]); err == nil && lo > lowestPort+2*clusterBusOffset {
				return lo
			}
		}
	}
	return 32768
}

// pick returns a port that was free a moment ago; with cluster, port+10000
// (the cluster bus) was free too, and both lie below the ephemeral range.
func (p *portPicker) pick(cluster bool) (int, error) {
	hi := p.hi
	if cluster {
		hi -= clusterBusOffset
	}
	for range 200 {
		p.mu.Lock()
		port := lowestPort + p.rnd.IntN(hi-lowestPort+1)
		p.mu.Unlock()
		if !portFree(port) {
			continue
		}
		if cluster && !portFree(port+clusterBusOffset) {
			continue
		}
		return port, nil
	}
	return 0, fmt.Errorf("redistest: no free loopback port found in %d..%d", lowestPort, hi)
}

// portFree reports whether 127.0.0.1:port can be bound right now.
func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}
