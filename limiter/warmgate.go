package limiter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// This file is what a Warmer does when Redis goes away and comes back
// (issue #20): it notices at once (a watch connection per node, and the
// connection errors of decisions), and, on a standalone Redis, bypasses
// the store until it has warmed it again, so that no decision pays for a
// dead pool, a dial storm or a script load in the meantime.
//
// Without the bypass, the first decisions after a restart each found a
// dead pooled connection, dialled a new one and met NOSCRIPT (then sent
// the script with EVAL): 14 concurrent decisions took 5 to 9 ms each
// under the race detector and missed the 5 ms deadline, and every
// connection they had dialled was dropped with its timed-out call, so the
// next burst dialled again (measured: three bursts in a row, 40 of 42
// decisions from the fallback, until the Warmer's next check).

// errStoreDown is the error of a decision that the store did not attempt
// because its Warmer knows Redis is unreachable and has not warmed it
// again yet. It wraps ErrStoreUnavailable (the fallback answers); the
// circuit breaker does not count it as a failure (no call was made), so
// the breaker is not open when Redis is warm again.
var errStoreDown = errors.New("redis unreachable, not warm again yet: decided in process without a store call")

// bypassErr is the error a decision gets instead of a store call while
// the store is bypassed, nil otherwise. It does no I/O and never blocks.
func (c *coldSignal) bypassErr() error {
	if c == nil || !c.down.Load() {
		return nil
	}
	return errBypassed
}

var errBypassed = fmt.Errorf("%w: %w", ErrStoreUnavailable, errStoreDown)

// lost is told the error of every failed store call. A connection error
// (Redis refused, reset or closed the connection, or is loading its data
// after a restart) wakes the Warmer, which warms the store again at once,
// and, where the Warmer allows it (a standalone Redis), bypasses the store
// until that succeeds. Deadlines and other errors change nothing here
// (the breaker handles a slow store). Safe for concurrent use; never
// blocks.
func (c *coldSignal) lost(err error) {
	if c == nil || c.fn.Load() == nil || !isConnErr(err) {
		return
	}
	if c.gate.Load() {
		c.down.Store(true)
	}
	c.notify()
}

// isConnErr reports whether err means the connection to Redis is gone or
// unusable (as opposed to a slow answer or a script error): EOF, a reset,
// a refused dial, a closed connection, or Redis LOADING its data set.
func isConnErr(err error) bool {
	if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return true
	}
	return redis.HasErrorPrefix(err, "LOADING")
}

// watchChannel is the Pub/Sub channel a Warmer subscribes to on every node
// so that its connection ends, and the Warmer learns it, the moment the
// node goes away. Nothing is published on it.
const watchChannel = "quotient:warm:watch"

// nodeWatch holds one subscribed connection per node of a store: when
// any of them ends (the node stopped, restarted or closed it), it calls
// gone once. Stop ends the watch without calling gone. Safe for
// concurrent use.
type nodeWatch struct {
	mu      sync.Mutex
	stopped bool
	subs    []*redis.PubSub
	wg      sync.WaitGroup
}

// watchNodes subscribes to watchChannel on every node of client (each
// primary and replica of a cluster) and calls gone, at most once, when
// one of those connections fails. The subscriptions cost one connection
// per node; Redis does not time subscribed clients out.
func watchNodes(ctx context.Context, client redis.UniversalClient, gone func(error)) *nodeWatch {
	w := &nodeWatch{}
	var once sync.Once
	start := func(node *redis.Client) {
		ps := node.Subscribe(ctx, watchChannel)
		w.mu.Lock()
		if w.stopped {
			w.mu.Unlock()
			_ = ps.Close()
			return
		}
		w.subs = append(w.subs, ps)
		w.wg.Add(1)
		w.mu.Unlock()
		go func() {
			defer w.wg.Done()
			for {
				_, err := ps.Receive(ctx)
				if err == nil {
					continue // the subscription's confirmation, or a pong
				}
				w.mu.Lock()
				stopped := w.stopped
				w.mu.Unlock()
				if !stopped && ctx.Err() == nil {
					once.Do(func() { gone(err) })
				}
				return
			}
		}()
	}
	switch c := client.(type) {
	case *redis.ClusterClient:
		_ = c.ForEachShard(ctx, func(_ context.Context, node *redis.Client) error {
			start(node)
			return nil
		})
	case *redis.Client:
		start(c)
	}
	return w
}

// stop closes the watch's connections and waits for its goroutines.
func (w *nodeWatch) stop() {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.stopped = true
	subs := w.subs
	w.subs = nil
	w.mu.Unlock()
	for _, ps := range subs {
		_ = ps.Close()
	}
	w.wg.Wait()
}

// reachable reports whether a standalone Redis accepts a connection,
// dialled with the client's own dialer (TLS included) outside its pool
// and closed at once; nil for other clients. A Warmer asks it before each
// warm-up while the store is not warm, because the pool counts failed
// dials and, after PoolSize of them, stops dialling and probes on its own
// only once a second (go-redis's dial breaker), which would hold the
// store cold for up to a second after Redis is back.
func (s *RedisStore) reachable(ctx context.Context) error {
	c, ok := s.client.(*redis.Client)
	if !ok {
		return nil
	}
	o := c.Options()
	if o.Dialer == nil {
		return nil
	}
	conn, err := o.Dialer(ctx, o.Network, o.Addr)
	if err != nil {
		return fmt.Errorf("%w: node %s: connect: %w", ErrNotWarm, o.Addr, err)
	}
	_ = conn.Close()
	return nil
}
