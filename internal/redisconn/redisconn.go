// Package redisconn builds the go-redis client of one region's Redis the
// same way in every binary (gateway, coordinator, and later servers):
// standalone or cluster, TLS, AUTH with a password or an ACL user, and
// addresses written host:port, redis://host:port or rediss://host:port.
// It also tells a misconfiguration (a refused AUTH, a TLS failure) apart
// from an outage (Check), so a binary can fail at start with one clear
// line for the first and keep retrying through the second.
//
// What it does not do: no flags or environment (cmd/ reads them), no
// goroutines beyond go-redis's own, no retries of its own. A password is
// never accepted inside an address, because addresses are flag values that
// `ps` shows.
package redisconn

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrConfig wraps every error about a bad address.
var ErrConfig = errors.New("redisconn: invalid setting")

// Options say how to reach one region's Redis. The zero value is not
// usable: Addrs is required.
type Options struct {
	// Addrs are host:port addresses. Several mean a Redis Cluster.
	Addrs []string
	// Cluster: Addrs[0] is a cluster configuration endpoint (ElastiCache
	// cluster mode), not a standalone server.
	Cluster bool
	// TLS, when non-nil, encrypts every connection (each node's own host
	// name is verified unless TLS.ServerName is set).
	TLS *tls.Config
	// Username is the ACL user (ElastiCache RBAC); empty means the
	// default user. Password is its password, or the AUTH token
	// (requirepass, ElastiCache AUTH); empty: no AUTH.
	Username, Password string
	// ContextTimeout makes a call's context deadline bound its network
	// I/O too (the gateway's per-decision deadline).
	ContextTimeout bool
}

// ParseAddrs reads a list of addresses, each host:port, redis://host[:port]
// or rediss://host[:port] (port 6379 by default), with an optional user
// name (rediss://alice@host:port) and nothing else: no password, no path,
// no query. It returns the host:port list, whether any address asked for
// TLS (rediss://; mixing redis:// and rediss:// is an error) and the user
// name found (one for all). Errors wrap ErrConfig and name the address.
func ParseAddrs(list []string) (addrs []string, useTLS bool, username string, err error) {
	schemes := map[string]bool{}
	for _, a := range list {
		if !strings.Contains(a, "://") {
			if _, _, err := net.SplitHostPort(a); err != nil {
				return nil, false, "", fmt.Errorf("%w: address %q: want host:port or rediss://host:port: %v", ErrConfig, a, err)
			}
			addrs = append(addrs, a)
			continue
		}
		u, err := url.Parse(a)
		if err != nil {
			return nil, false, "", fmt.Errorf("%w: address %q: %v", ErrConfig, redact(a), err)
		}
		switch {
		case u.Scheme != "redis" && u.Scheme != "rediss":
			return nil, false, "", fmt.Errorf("%w: address %q: scheme %q, want redis:// or rediss://", ErrConfig, a, u.Scheme)
		case u.User != nil && hasPassword(u.User):
			return nil, false, "", fmt.Errorf("%w: address %q holds a password, which ps would show: pass it in a file or the environment", ErrConfig, redact(a))
		case (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "":
			return nil, false, "", fmt.Errorf("%w: address %q: want scheme://[user@]host:port and nothing after it", ErrConfig, a)
		case u.Hostname() == "":
			return nil, false, "", fmt.Errorf("%w: address %q has no host", ErrConfig, a)
		}
		schemes[u.Scheme] = true
		if u.User != nil {
			if username != "" && username != u.User.Username() {
				return nil, false, "", fmt.Errorf("%w: addresses name two users, %q and %q", ErrConfig, username, u.User.Username())
			}
			username = u.User.Username()
		}
		port := u.Port()
		if port == "" {
			port = "6379"
		}
		addrs = append(addrs, net.JoinHostPort(u.Hostname(), port))
	}
	if schemes["redis"] && schemes["rediss"] {
		return nil, false, "", fmt.Errorf("%w: addresses mix redis:// and rediss://: TLS is for all of them or none", ErrConfig)
	}
	return addrs, schemes["rediss"], username, nil
}

func hasPassword(u *url.Userinfo) bool {
	_, ok := u.Password()
	return ok
}

// redact drops a password from an address for an error message.
func redact(a string) string {
	if u, err := url.Parse(a); err == nil {
		return u.Redacted()
	}
	if i := strings.LastIndex(a, "@"); i >= 0 {
		return "…@" + a[i+1:]
	}
	return a
}

// New returns a standalone client for one address, a cluster client for
// several or with Cluster. It does no I/O.
func (o Options) New() redis.UniversalClient {
	if o.Cluster || len(o.Addrs) > 1 {
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: o.Addrs, TLSConfig: o.TLS, Username: o.Username, Password: o.Password, ContextTimeoutEnabled: o.ContextTimeout,
		})
	}
	addr := ""
	if len(o.Addrs) > 0 {
		addr = o.Addrs[0]
	}
	return redis.NewClient(&redis.Options{
		Addr: addr, TLSConfig: o.TLS, Username: o.Username, Password: o.Password, ContextTimeoutEnabled: o.ContextTimeout,
	})
}

// ErrAuth wraps a refused AUTH: a wrong password or user, or a server that
// requires one and got none.
var ErrAuth = errors.New("redisconn: authentication refused")

// Check connects to Redis with a client of its own (no command retries,
// one dial attempt per connection) and pings it (a cluster: every primary it
// learns of), then closes that client. It returns nil, an error wrapping
// ErrAuth for a refused AUTH, or the connection's error: see
// tlsconfig.Diagnose for what that says about TLS, and expect a deadline
// error from a plaintext server spoken to with TLS (it waits for a line
// that never comes). It waits at most until ctx ends.
func (o Options) Check(ctx context.Context) error {
	var err error
	if o.Cluster || len(o.Addrs) > 1 {
		cc := redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: o.Addrs, TLSConfig: o.TLS, Username: o.Username, Password: o.Password,
			ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1, MaxRedirects: 1,
		})
		defer cc.Close()
		err = cc.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return n.Ping(ctx).Err() })
	} else {
		c := redis.NewClient(&redis.Options{
			Addr: o.Addrs[0], TLSConfig: o.TLS, Username: o.Username, Password: o.Password,
			ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1,
		})
		defer c.Close()
		err = c.Ping(ctx).Err()
	}
	if err != nil && IsAuthError(err) {
		return fmt.Errorf("%w: %v", ErrAuth, err)
	}
	return err
}

// IsAuthError reports whether err is Redis refusing authentication.
func IsAuthError(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	for _, s := range []string{"WRONGPASS", "NOAUTH", "invalid password", "invalid username-password pair", "AUTH <password> called without any password configured"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
