package httplimit

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/dunglas/httpsfv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/limiter"
)

var fuzzProxies, _ = limiter.ParseTrustedProxies([]string{"10.0.0.0/8", "2001:db8:ffff::/48"})

func fuzzRequest(remote, xff, fwd, xkey, auth string, repeatKey bool) *http.Request {
	r := httptest.NewRequest("GET", "/v1/x", nil)
	r.RemoteAddr = remote
	if xff != "" {
		r.Header["X-Forwarded-For"] = strings.Split(xff, "\n")
	}
	if fwd != "" {
		r.Header["Forwarded"] = []string{fwd}
	}
	if xkey != "" {
		r.Header["X-Api-Key"] = []string{xkey}
		if repeatKey {
			r.Header["X-Api-Key"] = append(r.Header["X-Api-Key"], xkey)
		}
	}
	if auth != "" {
		r.Header["Authorization"] = []string{auth}
	}
	return r
}

func FuzzIdentity(f *testing.F) {
	f.Add("203.0.113.5:1234", "1.2.3.4", "", "good-key", "", false)
	f.Add("10.1.2.3:80", "198.51.100.1, 10.9.9.9", "", "", "Bearer good-key", false)
	f.Add("10.1.2.3:80", "evil, 198.51.100.1", "for=\"[2001:db8::1]:80\"", "", "bearer  good-key ", false)
	f.Add("[2001:db8:ffff::1]:443", "2001:db8:1:2:3:4:5:6", "", "good-key", "Bearer other", false)
	f.Add("not-an-ip", "1.1.1.1", "", "good-key", "", true)
	f.Add("10.0.0.1:1", strings.Repeat("10.0.0.2,", 500), "for=unknown;proto=http", "good-key\x00", "", false)
	f.Add("[fe80::1%eth0]:1", "::ffff:1.2.3.4", "", strings.Repeat("k", 300), "Basic Zm9v", false)
	id := APIKeyIdentity(keyLookup, fuzzProxies)
	f.Fuzz(func(t *testing.T, remote, xff, fwd, xkey, auth string, repeatKey bool) {
		r := fuzzRequest(remote, xff, fwd, xkey, auth, repeatKey)
		got, err := id(r)
		peer, perr := netip.ParseAddrPort(remote)
		if err != nil {
			// Only an unreadable peer address is an error.
			if perr == nil {
				_, aerr := netip.ParseAddr(remote)
				assert.Error(t, aerr, "peer %q parsed but identity failed: %v", remote, err)
			}
			return
		}
		assert.True(t, got.IP.IsValid())
		if perr == nil && !fuzzProxies.Contains(peer.Addr()) {
			assert.Equal(t, peer.Addr().Unmap().WithZone(""), got.IP, "an untrusted peer cannot choose its address")
		}
		if got.APIKey != "" {
			info, known := keys[got.APIKey]
			require.True(t, known, "only known keys become subjects: %q", got.APIKey)
			assert.Equal(t, info.Tier, got.Tier)
			assert.Equal(t, info.Account, got.Account)
			presented := strings.Contains(xkey, got.APIKey) || strings.Contains(auth, got.APIKey)
			assert.True(t, presented)
		} else {
			assert.Equal(t, AnonymousTier, got.Tier)
			assert.Empty(t, got.Account)
		}
	})
}

func FuzzMiddleware(f *testing.F) {
	f.Add("/v1/x", "GET", "good-key", "1.2.3.4", 3)
	f.Add("/login", "POST", "", "", 5)
	f.Add("/%0d%0aSet-Cookie:%20x=y", "GET", "good-key\r\nX-Injected: 1", "1.2.3.4\r\nX: y", 2)
	f.Add("/"+strings.Repeat("a", 5000), "DELETE", strings.Repeat("\xff", 40), "::1", 1)
	l := newLimiter(f, limiter.Config{}, testPolicies)
	h := Middleware(l, WithIdentity(APIKeyIdentity(keyLookup, fuzzProxies)))(okHandler())
	f.Fuzz(func(t *testing.T, path, method, key, xff string, n int) {
		if n < 1 || n > 8 {
			n = 1 + (n&7+8)%8
		}
		if method == "" || strings.ContainsAny(method, " \r\n\t") || len(method) > 16 {
			method = "GET"
		}
		r := httptest.NewRequest("GET", "/", nil)
		r.Method = method
		r.URL.Path = path
		r.RemoteAddr = "10.0.0.1:9"
		r.Header["X-Api-Key"] = []string{key}
		r.Header["X-Forwarded-For"] = []string{xff}
		for range n {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			assert.Contains(t, []int{200, 400, 429, 503}, w.Code)
			for name, vs := range w.Header() {
				for _, v := range vs {
					assert.NotContains(t, v, "\r", name)
					assert.NotContains(t, v, "\n", name)
				}
			}
			assert.Empty(t, w.Header().Get("Set-Cookie"))
			assert.Empty(t, w.Header().Get("X-Injected"))
			for _, name := range []string{HeaderRateLimit, HeaderRateLimitPolicy} {
				if vs := w.Header().Values(name); len(vs) > 0 {
					_, err := httpsfv.UnmarshalList(vs)
					assert.NoError(t, err, "%s: %q", name, vs)
				}
			}
			if w.Code != 200 {
				var p Problem
				require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p), w.Body.String())
				assert.Equal(t, w.Code, p.Status)
				assert.LessOrEqual(t, len(p.Instance), maxInstance)
			}
		}
	})
}
