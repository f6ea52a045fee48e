// Package slowkafka starts, for tests, a one-broker kfake Kafka cluster that
// is far away: every byte between a client and the broker is delayed by a
// fixed one-way latency in each direction (toxiproxy, used as a library),
// so one request/response round trip costs twice that latency.
//
// Invariant: the broker advertises the proxy's address, so metadata never
// routes a client around the delay. Everything listens on loopback and is
// stopped by the test's Cleanup.
package slowkafka

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
)

// advertised is a broker listener that reports another address (its
// proxy's), so that kfake's metadata sends every client through the proxy.
type advertised struct {
	net.Listener
	addr net.Addr
}

func (a advertised) Addr() net.Addr { return a.addr }

// Start starts the cluster with oneWay (> 0) added to each direction and
// returns its bootstrap addresses (the proxy's). It fails tb if anything
// cannot be started; tb's Cleanup stops the proxy and the broker.
func Start(tb testing.TB, oneWay time.Duration) []string {
	tb.Helper()
	require.Positive(tb, oneWay, "slowkafka: one-way delay")
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	var proxies []*toxiproxy.Proxy
	listen := func(network, address string) (net.Listener, error) {
		ln, err := net.Listen(network, address)
		if err != nil {
			return nil, err
		}
		p := toxiproxy.NewProxy(srv, fmt.Sprintf("broker-%d", len(proxies)), "127.0.0.1:0", ln.Addr().String())
		if err := p.Start(); err != nil {
			_ = ln.Close()
			return nil, err
		}
		proxies = append(proxies, p)
		for _, stream := range []string{"upstream", "downstream"} {
			doc := fmt.Sprintf(`{"name":"latency_%s","type":"latency","stream":%q,"toxicity":1,"attributes":{"latency":%d}}`,
				stream, stream, oneWay.Milliseconds())
			if _, err := p.Toxics.AddToxicJson(strings.NewReader(doc)); err != nil {
				_ = ln.Close()
				return nil, err
			}
		}
		pa, err := net.ResolveTCPAddr("tcp", p.Listen)
		if err != nil {
			_ = ln.Close()
			return nil, err
		}
		return advertised{Listener: ln, addr: pa}, nil
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.ListenFn(listen))
	require.NoError(tb, err)
	tb.Cleanup(func() {
		for _, p := range proxies {
			p.Stop()
		}
		c.Close()
	})
	return c.ListenAddrs()
}
