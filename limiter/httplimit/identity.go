package httplimit

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/quotientlabs/quotient/limiter"
)

// AnonymousTier is the tier of callers without a known API key.
const AnonymousTier = "anonymous"

// MaxAPIKeyLen is the longest API key read from a request, in bytes;
// longer values are treated as no key.
const MaxAPIKeyLen = 256

// KeyInfo is what a known API key stands for.
type KeyInfo struct {
	Tier    string `json:"tier"`
	Account string `json:"account,omitempty"`
	User    string `json:"user,omitempty"`
}

// APIKey returns the API key a request presents: the X-API-Key field, or
// the token of "Authorization: Bearer <token>" (scheme case-insensitive).
// It returns false when there is none, or when the request is ambiguous: a
// field repeated, both fields with different keys, an empty or oversized
// key, or a key with bytes outside visible ASCII.
func APIKey(r *http.Request) (string, bool) {
	var key string
	found := false
	if vs := r.Header.Values("X-API-Key"); len(vs) > 0 {
		if len(vs) > 1 {
			return "", false
		}
		key, found = strings.TrimSpace(vs[0]), true
	}
	if vs := r.Header.Values("Authorization"); len(vs) > 0 {
		if len(vs) > 1 {
			return "", false
		}
		scheme, token, ok := strings.Cut(strings.TrimSpace(vs[0]), " ")
		if ok && strings.EqualFold(scheme, "Bearer") {
			token = strings.TrimSpace(token)
			if found && token != key {
				return "", false
			}
			key, found = token, true
		}
	}
	if !found || key == "" || len(key) > MaxAPIKeyLen {
		return "", false
	}
	for i := 0; i < len(key); i++ {
		if key[i] <= ' ' || key[i] >= 0x7f {
			return "", false
		}
	}
	return key, true
}

// APIKeyIdentity identifies callers by API key: a key that lookup knows
// gives the identity (API key, account, user, tier) plus the client
// address; any other request is anonymous (tier "anonymous", client
// address only). The client address comes from proxies.ClientIP; a
// request whose address cannot be read is an error.
func APIKeyIdentity(lookup func(key string) (KeyInfo, bool), proxies *limiter.TrustedProxies) IdentityFunc {
	return func(r *http.Request) (limiter.Identity, error) {
		ip, ok := proxies.ClientIP(r)
		if !ok {
			return limiter.Identity{}, fmt.Errorf("remote address %q is not an IP address", r.RemoteAddr)
		}
		id := limiter.Identity{IP: ip, Tier: AnonymousTier}
		if key, ok := APIKey(r); ok {
			if info, known := lookup(key); known {
				id.APIKey, id.Account, id.User, id.Tier = key, info.Account, info.User, info.Tier
				if id.Tier == "" {
					id.Tier = "default"
				}
			}
		}
		return id, nil
	}
}
