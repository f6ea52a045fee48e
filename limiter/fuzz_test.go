package limiter

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// FuzzParsePolicies: any input either parses into valid policies or fails
// with a *PolicyError naming fields; it never panics, and what parses
// round-trips through New.
func FuzzParsePolicies(f *testing.F) {
	f.Add([]byte(seedExample))
	f.Add([]byte(`[{"id":"a","algorithm":"fixed_window","limit":5,"window_s":60,"cost":{"GET /x":2}}]`))
	f.Add([]byte(`[{"id":"a","algorithm":"leaky_bucket","rate_per_sec":0.5,"burst":2,"match":{"methods":["GET"]}}]`))
	f.Add([]byte(`[{"id":"a","id":"a"}]`))
	f.Add([]byte(`[{"id":"a","algorithm":"token_bucket","rate_per_sec":1e308}]`))
	f.Add([]byte(`{"match":{"routes":[1]}}`))
	f.Add([]byte(`[{"id":"m","algorithm":"fixed_window","limit":9,"window":"month","scope":"global"}]`))
	f.Add([]byte(`[{"id":"m","algorithm":"fixed_window","limit":9,"window":"month","window_s":0}]`))
	// The bounds: sliding_window_log at and over MaxSlidingLogLimit, the
	// other windows at MaxLimit, buckets at their smallest and largest.
	f.Add([]byte(`[{"id":"l","algorithm":"sliding_window_log","limit":1000,"window_s":31622400}]`))
	f.Add([]byte(`[{"id":"l","algorithm":"sliding_window_log","limit":1001,"window_s":1}]`))
	f.Add([]byte(`[{"id":"c","algorithm":"sliding_window_counter","limit":1000000000000,"window_s":31622400}]`))
	f.Add([]byte(`[{"id":"b","algorithm":"token_bucket","rate_per_sec":0.001,"burst":1,"scope":"global"}]`))
	f.Add([]byte(`[{"id":"b","algorithm":"leaky_bucket","rate_per_sec":1000000000,"burst":1000000,"cost":{"POST /x":1000000}}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ps, err := ParsePolicies(data)
		if err != nil {
			var pe *PolicyError
			require.ErrorAs(t, err, &pe)
			require.NotEmpty(t, pe.Fields)
			for _, fe := range pe.Fields {
				require.NotEmpty(t, fe.Path)
				require.NotEmpty(t, fe.Msg)
			}
			return
		}
		_, err = New(Config{}, ps)
		require.NoError(t, err)
		now := time.Date(2028, 2, 29, 23, 59, 59, 0, time.UTC)
		for _, p := range ps {
			require.True(t, p.Capacity() > 0)
			if p.Algorithm == SlidingWindowLog {
				require.LessOrEqual(t, p.Limit, int64(MaxSlidingLogLimit), p.ID)
			}
			if p.Algorithm == FixedWindow {
				// Every fixed window, of a length or a month, contains now.
				start, end := p.WindowAt(now)
				require.False(t, now.Before(start) || !now.Before(end), "%s: [%s, %s)", p.ID, start, end)
			}
		}
	})
}

// FuzzSubjectKey: any byte string is a safe subject (no braces, decodes
// back, one slot for all of its keys).
func FuzzSubjectKey(f *testing.F) {
	for _, s := range []string{"", "abc", "a{b}c", "%", "%25", "\x00", "ü", "{", "}{"} {
		f.Add(s, uint8(0))
	}
	kinds := []SubjectKind{SubjectAPIKey, SubjectAccount, SubjectUser, SubjectIP}
	f.Fuzz(func(t *testing.T, value string, kind uint8) {
		checkSubjectKey(t, Subject{Kind: kinds[int(kind)%len(kinds)], Value: value})
	})
}

// FuzzClientIP: hostile forwarding headers never panic, and a request from
// an untrusted peer is always attributed to the peer itself.
func FuzzClientIP(f *testing.F) {
	f.Add("203.0.113.9:1", "1.2.3.4, 5.6.7.8", "")
	f.Add("10.0.0.1:1", "1.2.3.4, 10.0.0.2", `for=2001:db8::1`)
	f.Add("10.0.0.1:1", ",,,", `for="[::1]:80";for=x, for=`)
	f.Add("[::1]:1", "\x00", "\xff")
	trusted, err := ParseTrustedProxies([]string{"10.0.0.0/8", "::1"})
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, remote, xff, fwd string) {
		r := &http.Request{RemoteAddr: remote, Header: http.Header{}}
		if xff != "" {
			r.Header.Set("X-Forwarded-For", xff)
		}
		if fwd != "" {
			r.Header.Set("Forwarded", fwd)
		}
		ip, ok := trusted.ClientIP(r)
		peer, peerOK := parseHostPort(remote)
		require.Equal(t, peerOK, ok)
		if ok && !trusted.Contains(peer) {
			require.Equal(t, peer, ip, "untrusted peer's headers must be ignored")
		}
	})
}
