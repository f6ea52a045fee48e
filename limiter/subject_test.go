package limiter

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// unescapeKey inverts Subject.Key, for the injectivity checks.
func unescapeKey(t testing.TB, key string) Subject {
	t.Helper()
	kinds := map[string]SubjectKind{"k:": SubjectAPIKey, "a:": SubjectAccount, "u:": SubjectUser, "ip:": SubjectIP}
	for prefix, kind := range kinds {
		if rest, ok := strings.CutPrefix(key, prefix); ok {
			var b strings.Builder
			for i := 0; i < len(rest); i++ {
				if rest[i] == '%' {
					require.Less(t, i+2, len(rest)+0, "truncated escape in %q", key)
					var v byte
					for _, h := range rest[i+1 : i+3] {
						v <<= 4
						switch {
						case '0' <= h && h <= '9':
							v |= byte(h - '0')
						case 'A' <= h && h <= 'F':
							v |= byte(h - 'A' + 10)
						default:
							t.Fatalf("bad escape in %q", key)
						}
					}
					b.WriteByte(v)
					i += 2
					continue
				}
				b.WriteByte(rest[i])
			}
			return Subject{Kind: kind, Value: b.String()}
		}
	}
	t.Fatalf("key %q has no kind prefix", key)
	return Subject{}
}

// checkSubjectKey holds for every subject: the key has no hash-tag braces,
// decodes back to the subject (so distinct subjects have distinct keys),
// and every key built from it hashes to the slot of its hash tag.
func checkSubjectKey(t testing.TB, s Subject) {
	key := s.Key()
	require.NotContains(t, key, "{")
	require.NotContains(t, key, "}")
	require.Equal(t, s, unescapeKey(t, key))
	p := &Policy{ID: "p1", Algorithm: TokenBucket}
	slot := redisSlot(StateKey(s, p))
	require.Equal(t, slot, redisSlot(ShareKey(s, "other")))
	require.Equal(t, slot, redisSlot(key), "the slot is the hash tag's")
}

// redisSlot is Redis Cluster's key slot (CRC16 of the hash tag, or of the
// whole key without one), as the cluster computes it.
func redisSlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % 16384)
}

// crc16 is CRC16-CCITT (XModem), the hash of Redis Cluster.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

func TestSubjectKeys(t *testing.T) {
	subjects := []Subject{
		{SubjectAPIKey, "abc123"},
		{SubjectAPIKey, "a}b{c"},
		{SubjectAPIKey, "%41"}, // must not collide with "A"
		{SubjectAPIKey, "A"},
		{SubjectAPIKey, "x\r\nSET evil 1"},
		{SubjectAPIKey, "\x00\xff"},
		{SubjectAccount, "abc123"},
		{SubjectUser, "ü"},
		{SubjectIP, "2001:db8::/64"},
	}
	seen := map[string]Subject{}
	for _, s := range subjects {
		checkSubjectKey(t, s)
		key := s.Key()
		if prev, dup := seen[key]; dup {
			t.Fatalf("%v and %v share key %q", prev, s, key)
		}
		seen[key] = s
	}
	assert.Equal(t, "k:abc123", Subject{SubjectAPIKey, "abc123"}.Key())
	assert.Equal(t, "a:abc123", Subject{SubjectAccount, "abc123"}.Key())
	assert.Equal(t, "k:a%7Db%7Bc", Subject{SubjectAPIKey, "a}b{c"}.Key())
}

func TestCRC16MatchesRedis(t *testing.T) {
	// The reference value from the Redis Cluster specification.
	assert.Equal(t, uint16(0x31C3), crc16("123456789"))
}

func TestIPSubject(t *testing.T) {
	cases := map[string]string{
		"192.0.2.7":                  "192.0.2.7",
		"::ffff:192.0.2.7":           "192.0.2.7",
		"2001:db8:1:2:3:4:5:6":       "2001:db8:1:2::/64",
		"2001:db8:1:2:ffff::1":       "2001:db8:1:2::/64",
		"fe80::1%eth0":               "fe80::/64",
		"2001:db8:1:3::1":            "2001:db8:1:3::/64",
		"::1":                        "::/64",
		"2001:0db8:0001:0002::abcd":  "2001:db8:1:2::/64",
		"2001:db8:ffff:ffff:ffff::1": "2001:db8:ffff:ffff::/64",
	}
	for in, want := range cases {
		assert.Equal(t, want, IPSubject(netip.MustParseAddr(in)), in)
	}
}

func TestIdentitySubjects(t *testing.T) {
	id := Identity{APIKey: "k1", Account: "acme", IP: netip.MustParseAddr("2001:db8::99")}
	s, ok := id.Subject(SubjectAPIKey)
	assert.True(t, ok)
	assert.Equal(t, Subject{SubjectAPIKey, "k1"}, s)
	_, ok = id.Subject(SubjectUser)
	assert.False(t, ok, "no user: policies on users do not apply")
	s, ok = id.Subject(SubjectIP)
	assert.True(t, ok)
	assert.Equal(t, "2001:db8::/64", s.Value)
	_, ok = Identity{}.Subject(SubjectIP)
	assert.False(t, ok)
}

func TestClientIP(t *testing.T) {
	trusted, err := ParseTrustedProxies([]string{"10.0.0.0/8", "2001:db8:ffff::/48", "192.0.2.1"})
	require.NoError(t, err)
	cases := []struct {
		name, remote string
		headers      map[string][]string
		want         string
	}{
		{"direct client, header ignored", "203.0.113.9:5555", map[string][]string{"X-Forwarded-For": {"1.1.1.1"}}, "203.0.113.9"},
		{"trusted proxy, client from XFF", "10.1.2.3:80", map[string][]string{"X-Forwarded-For": {"198.51.100.4"}}, "198.51.100.4"},
		{"spoofed left part skipped", "10.1.2.3:80", map[string][]string{"X-Forwarded-For": {"6.6.6.6, 198.51.100.4"}}, "198.51.100.4"},
		{"chain of trusted proxies", "10.1.2.3:80", map[string][]string{"X-Forwarded-For": {"198.51.100.4, 10.9.9.9, 192.0.2.1"}}, "198.51.100.4"},
		{"repeated header lines", "10.1.2.3:80", map[string][]string{"X-Forwarded-For": {"6.6.6.6", "198.51.100.4, 10.0.0.1"}}, "198.51.100.4"},
		{"garbage stops the walk", "10.1.2.3:80", map[string][]string{"X-Forwarded-For": {"not-an-ip"}}, "10.1.2.3"},
		{"garbage behind a trusted hop", "10.1.2.3:80", map[string][]string{"X-Forwarded-For": {"junk, 10.7.7.7"}}, "10.7.7.7"},
		{"Forwarded preferred", "10.1.2.3:80", map[string][]string{"Forwarded": {`for=198.51.100.8;proto=https`}, "X-Forwarded-For": {"6.6.6.6"}}, "198.51.100.8"},
		{"Forwarded IPv6 with port", "[2001:db8:ffff::1]:443", map[string][]string{"Forwarded": {`for="[2001:db8:1::17]:4711"`}}, "2001:db8:1::17"},
		{"all trusted: the leftmost", "10.1.2.3:80", map[string][]string{"X-Forwarded-For": {"10.2.2.2"}}, "10.2.2.2"},
		{"no header from a proxy", "10.1.2.3:80", nil, "10.1.2.3"},
		{"mapped IPv4 peer", "[::ffff:203.0.113.9]:1", nil, "203.0.113.9"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := &http.Request{RemoteAddr: c.remote, Header: http.Header{}}
			for k, vs := range c.headers {
				for _, v := range vs {
					r.Header.Add(k, v)
				}
			}
			ip, ok := trusted.ClientIP(r)
			require.True(t, ok)
			assert.Equal(t, c.want, ip.String())
		})
	}
	_, err = ParseTrustedProxies([]string{"10.0.0.0/8", "bogus"})
	assert.ErrorContains(t, err, `trusted proxy [1] "bogus"`)
	var none *TrustedProxies
	ip, ok := none.ClientIP(&http.Request{RemoteAddr: "10.0.0.1:1", Header: http.Header{"X-Forwarded-For": {"1.2.3.4"}}})
	assert.True(t, ok)
	assert.Equal(t, "10.0.0.1", ip.String(), "nobody trusted by default")
}
