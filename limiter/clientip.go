package limiter

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// TrustedProxies is the set of addresses whose forwarding headers are
// believed. The zero value trusts nobody. It is immutable and safe for
// concurrent use.
type TrustedProxies struct {
	prefixes []netip.Prefix
}

// ParseTrustedProxies parses CIDR prefixes ("10.0.0.0/8") or single
// addresses ("192.0.2.7", meaning /32 or /128). An entry that parses as
// neither is an error naming it.
func ParseTrustedProxies(list []string) (*TrustedProxies, error) {
	t := &TrustedProxies{}
	for i, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if p, err := netip.ParsePrefix(s); err == nil {
			t.prefixes = append(t.prefixes, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("limiter: trusted proxy [%d] %q: not a CIDR prefix or IP address", i, s)
		}
		a = a.Unmap()
		t.prefixes = append(t.prefixes, netip.PrefixFrom(a, a.BitLen()))
	}
	return t, nil
}

// Contains reports whether ip is a trusted proxy.
func (t *TrustedProxies) Contains(ip netip.Addr) bool {
	if t == nil {
		return false
	}
	ip = ip.Unmap()
	for _, p := range t.prefixes {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// ClientIP returns the address of the client that sent r. It is the direct
// peer (r.RemoteAddr) unless the peer is a trusted proxy; then the
// forwarding chain is walked from the right (the hop nearest to us), skipping
// trusted proxies, and the first address that is not a trusted proxy is the
// client. The Forwarded header (RFC 7239) is used when present, else
// X-Forwarded-For. Entries left of the first untrusted one are never read,
// so a client cannot choose its own address by sending a forged header. An
// unparsable entry ends the walk at the last hop known good. It returns
// false only when RemoteAddr itself is not an address.
func (t *TrustedProxies) ClientIP(r *http.Request) (netip.Addr, bool) {
	peer, ok := parseHostPort(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, false
	}
	if !t.Contains(peer) {
		return peer, true
	}
	var chain []string
	if fw := r.Header.Values("Forwarded"); len(fw) > 0 {
		chain = forwardedFor(fw)
	} else {
		for _, v := range r.Header.Values("X-Forwarded-For") {
			for _, part := range strings.Split(v, ",") {
				chain = append(chain, strings.TrimSpace(part))
			}
		}
	}
	client := peer
	for i := len(chain) - 1; i >= 0; i-- {
		a, ok := parseNodeAddr(chain[i])
		if !ok {
			return client, true
		}
		client = a
		if !t.Contains(a) {
			return a, true
		}
	}
	return client, true
}

// forwardedFor extracts the for= parameters of Forwarded header values, in
// order. An element without for= yields "" (unparsable, so it ends the walk).
func forwardedFor(values []string) []string {
	var out []string
	for _, v := range values {
		for _, elem := range strings.Split(v, ",") {
			found := ""
			for _, pair := range strings.Split(elem, ";") {
				k, val, ok := strings.Cut(strings.TrimSpace(pair), "=")
				if ok && strings.EqualFold(strings.TrimSpace(k), "for") {
					found = strings.Trim(strings.TrimSpace(val), `"`)
				}
			}
			out = append(out, found)
		}
	}
	return out
}

// parseNodeAddr parses "1.2.3.4", "1.2.3.4:80", "2001:db8::1",
// "[2001:db8::1]" or "[2001:db8::1]:80".
func parseNodeAddr(s string) (netip.Addr, bool) {
	if s == "" || len(s) > 64 {
		return netip.Addr{}, false
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone(""), true
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil {
			return a.Unmap().WithZone(""), true
		}
	}
	return parseHostPort(s)
}

func parseHostPort(s string) (netip.Addr, bool) {
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		host = s
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}
