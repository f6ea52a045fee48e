package limiter

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzParseSubjectKey: ParseSubjectKey inverts Subject.Key for every
// subject, and any other string is either a subject key or an error, never
// a panic; what parses encodes back to the same string.
func FuzzParseSubjectKey(f *testing.F) {
	for _, s := range []string{"k:abc", "a:x%7Dy", "ip:2001:db8::/64", "u:", "zz:1", "k:%4", "k:%zz", ""} {
		f.Add(s, "value", uint8(0))
	}
	kinds := []SubjectKind{SubjectAPIKey, SubjectAccount, SubjectUser, SubjectIP, SubjectDescriptor}
	f.Fuzz(func(t *testing.T, raw, value string, kind uint8) {
		subj := Subject{Kind: kinds[int(kind)%len(kinds)], Value: value}
		got, err := ParseSubjectKey(subj.Key())
		require.NoError(t, err)
		require.Equal(t, subj, got)
		if s, err := ParseSubjectKey(raw); err == nil {
			require.Equal(t, raw, s.Key(), "a parsed key encodes back to itself")
		}
	})
}
