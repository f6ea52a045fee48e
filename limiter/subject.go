package limiter

import (
	"net/netip"
	"strings"
)

// SubjectDescriptor is an Envoy rate limit descriptor: a domain and the
// descriptor's entries, as package rls encodes them. Policy documents do
// not select it (Identity has no descriptor); package rls passes such
// subjects to [Limiter.CheckSubjectsInto] with the policies of its
// configuration.
const SubjectDescriptor SubjectKind = "descriptor"

// Subject is what one policy limits: a kind and a value.
type Subject struct {
	Kind  SubjectKind
	Value string
}

// Key is the subject's form inside store keys: a kind prefix ("k:" API key,
// "a:" account, "u:" user, "ip:" address or prefix, "d:" descriptor) and the value with every
// byte outside [A-Za-z0-9._~:/@+=-] escaped as %XX. The mapping is
// injective, so two subjects never share a key, and the result never
// contains '{' or '}', so it can sit inside a Redis Cluster hash tag: every
// key of one subject lands in the same slot whatever bytes the value holds.
func (s Subject) Key() string {
	if prefix, plain := s.keyPrefix(); plain {
		return prefix + s.Value
	}
	return s.escapedKey()
}

// keyPrefix is Key's kind prefix, and whether Key is that prefix and the
// value as it is (no byte to escape): then a caller can append both
// without building Key.
func (s Subject) keyPrefix() (string, bool) {
	prefix := "?:"
	switch s.Kind {
	case SubjectAPIKey:
		prefix = "k:"
	case SubjectAccount:
		prefix = "a:"
	case SubjectUser:
		prefix = "u:"
	case SubjectIP:
		prefix = "ip:"
	case SubjectDescriptor:
		prefix = "d:"
	}
	return prefix, !needsEscape(s.Value)
}

// escapedKey is Key for a value with bytes to escape.
func (s Subject) escapedKey() string {
	prefix, _ := s.keyPrefix()
	var b strings.Builder
	b.Grow(len(prefix) + len(s.Value) + 16)
	b.WriteString(prefix)
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s.Value); i++ {
		c := s.Value[i]
		if safeByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

func safeByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '.', '_', '~', ':', '/', '@', '+', '=', '-':
		return true
	}
	return false
}

func needsEscape(s string) bool {
	for i := 0; i < len(s); i++ {
		if !safeByte(s[i]) {
			return true
		}
	}
	return false
}

// Identity is what a gateway knows about the caller of one request. Any
// field may be empty; a policy whose subject kind is empty in the identity
// does not apply to the request.
type Identity struct {
	// APIKey is the caller's API key; any byte string is safe.
	APIKey string
	// Account and User are the account and user the key belongs to.
	Account string
	User    string
	// Tier is the plan tier that policies match on ("anonymous" for callers
	// without a known key, by the gateway's convention).
	Tier string
	// IP is the client address; IPv6 addresses are limited per /64 prefix,
	// IPv4-mapped IPv6 addresses as IPv4.
	IP netip.Addr
}

// Subject returns the identity's subject of the given kind, and false when
// the identity has none.
func (id Identity) Subject(kind SubjectKind) (Subject, bool) {
	var v string
	switch kind {
	case SubjectAPIKey:
		v = id.APIKey
	case SubjectAccount:
		v = id.Account
	case SubjectUser:
		v = id.User
	case SubjectIP:
		if !id.IP.IsValid() {
			return Subject{}, false
		}
		v = IPSubject(id.IP)
	}
	if v == "" {
		return Subject{}, false
	}
	return Subject{Kind: kind, Value: v}, true
}

// IPSubject is the subject value for a client address: the IPv4 address
// itself, or the /64 prefix of an IPv6 address ("2001:db8:1:2::/64"), so
// that one host cannot escape its limit by rotating through the addresses
// of its own prefix. IPv4-mapped IPv6 addresses count as IPv4; zones are
// dropped.
func IPSubject(ip netip.Addr) string {
	ip = ip.Unmap().WithZone("")
	if ip.Is4() {
		return ip.String()
	}
	return netip.PrefixFrom(ip, 64).Masked().String()
}
