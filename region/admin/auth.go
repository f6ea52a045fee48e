package admin

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
)

// Role is what a token may do.
type Role string

// Roles. Admin includes read.
const (
	// RoleRead may call every GET.
	RoleRead Role = "read"
	// RoleAdmin may also write (PUT, POST, DELETE).
	RoleAdmin Role = "admin"
)

// allows reports whether role r may do what need requires.
func (r Role) allows(need Role) bool {
	return r == RoleAdmin || r == need
}

// Principal is an authenticated caller.
type Principal struct {
	// Name identifies the caller in the audit log.
	Name string
	Role Role
}

// Tokens maps bearer tokens to principals. Tokens are kept only as SHA-256
// digests, so a lookup takes the same time whatever prefix of a token
// matches. The zero value knows no token. A Tokens is immutable and safe for
// concurrent use.
type Tokens struct {
	byDigest map[[32]byte]Principal
}

// ErrBadTokens is wrapped by ParseTokens errors.
var ErrBadTokens = errors.New("admin: bad token file")

// MinTokenLen is the shortest token accepted, bytes.
const MinTokenLen = 16

// ParseTokens reads a token file: one token per line as
//
//	<name> <role> <token>
//
// with role read or admin, names unique, tokens at least MinTokenLen bytes
// and unique; blank lines and lines starting with '#' are ignored. Errors
// name the line and never echo a token.
func ParseTokens(data []byte) (*Tokens, error) {
	t := &Tokens{byDigest: map[[32]byte]Principal{}}
	names := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			return nil, fmt.Errorf("%w: line %d: want \"<name> <role> <token>\", got %d fields", ErrBadTokens, n, len(f))
		}
		name, role, tok := f[0], Role(f[1]), f[2]
		if role != RoleRead && role != RoleAdmin {
			return nil, fmt.Errorf("%w: line %d: role %q: must be read or admin", ErrBadTokens, n, role)
		}
		if names[name] {
			return nil, fmt.Errorf("%w: line %d: name %q appears twice", ErrBadTokens, n, name)
		}
		if len(tok) < MinTokenLen {
			return nil, fmt.Errorf("%w: line %d: token of %q is shorter than %d bytes", ErrBadTokens, n, name, MinTokenLen)
		}
		d := sha256.Sum256([]byte(tok))
		if _, dup := t.byDigest[d]; dup {
			return nil, fmt.Errorf("%w: line %d: token of %q is also another principal's", ErrBadTokens, n, name)
		}
		names[name] = true
		t.byDigest[d] = Principal{Name: name, Role: role}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadTokens, err)
	}
	return t, nil
}

// Lookup returns the principal of token.
func (t *Tokens) Lookup(token string) (Principal, bool) {
	if t == nil || token == "" {
		return Principal{}, false
	}
	p, ok := t.byDigest[sha256.Sum256([]byte(token))]
	return p, ok
}
