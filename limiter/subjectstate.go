package limiter

import (
	"encoding/binary"
	"fmt"
)

// Subject states: the Redis layout of the states that fit in a few bytes.
//
// Every token bucket, leaky bucket, fixed window (not global) and sliding
// window counter of one subject is an entry of one string key,
// rl:{<subject>} (subjectKey), so one GET reads all of them and one SET
// writes them: a decision costs Redis two commands per subject, not two
// per policy. An entry is, big-endian (script.lua writes it):
//
//	B algo (1 token bucket, 2 leaky bucket, 3 fixed window, 5 sliding window counter)
//	B+bytes the policy id
//	I6 expiry, Unix ms: from then on the entry is gone, exactly as a key of
//	   its own with that TTL would be (the TTLs of algorithm.go: report)
//	state: algo 1, 2: 12 bytes (the bucket, as algorithm.go describes)
//	       algo 3:    I6 window start (ms), I7 count
//	       algo 5:    I6 window start (ms), I7 current count, I7 previous count
//
// The key's TTL is the latest expiry of its entries (the longest any of
// the subject's policies needs). A write copies the entries it does not
// change as they are and drops those expired, so the state of a policy
// that a request does not name (another route's policy, a policy removed
// from the set) lives exactly its own TTL. Sliding window logs (a list)
// and global fixed windows (a hash the coordinator merges into) keep a key
// of their own, as do shares (written by the coordinator).
//
// Upgrade from the layout before (one key per policy,
// rl:{<subject>}:<policy>:tb|lb|fw|sc): when a subject's key has no live
// entry for a policy, the script reads that policy's key of the old
// layout and decides from it; the first write moves the state into the
// subject's key. The old key is never written again or deleted: it
// expires by its own TTL (at most a window, or the time to refill a
// bucket, plus a second). So gateways upgraded all at once lose no state.
// During a rolling upgrade, a subject decided by old and new gateways at
// once has two states per policy from its first decision by a new
// gateway until the last old gateway is gone: each version admits up to
// the limit against its own state, so over that time a subject can be
// admitted up to twice its limit (a window's admissions by old gateways
// after the move are not counted in the new state). Upgrade the
// gateways of a region quickly, or accept that margin once.

// subjectEntry is one entry of a subject state (see above), its state in
// the form the MemoryStore keeps (a, b, c as algorithm.go's state).
type subjectEntry struct {
	algo     int // script.lua's code: 1, 2, 3 or 5
	policy   string
	expireMs int64
	st       state
}

// entrySizes are the state bytes of an entry by algo.
var entrySizes = [...]int{1: 12, 2: 12, 3: 13, 5: 20}

// parseSubjectState splits the value of a subject's key into its entries.
// It fails, saying where, on a value that is not a subject state.
func parseSubjectState(v []byte) ([]subjectEntry, error) {
	var out []subjectEntry
	for p := 0; p < len(v); {
		if p+2 > len(v) {
			return nil, fmt.Errorf("subject state: entry at byte %d cut short", p)
		}
		algo, idLen := int(v[p]), int(v[p+1])
		if algo >= len(entrySizes) || entrySizes[algo] == 0 {
			return nil, fmt.Errorf("subject state: entry at byte %d has algo %d", p, algo)
		}
		q := p + 2 + idLen + 6
		if q+entrySizes[algo] > len(v) {
			return nil, fmt.Errorf("subject state: entry at byte %d cut short", p)
		}
		e := subjectEntry{algo: algo, policy: string(v[p+2 : p+2+idLen]), expireMs: int64(uint48(v[q-6:]))}
		s := v[q:]
		switch algo {
		case 1, 2:
			e.st = unpackBucket(s)
		case 3:
			e.st = state{a: int64(uint48(s)), b: int64(uint56(s[6:])), capv: -1}
		case 5:
			e.st = state{a: int64(uint48(s)), b: int64(uint56(s[6:])), c: int64(uint56(s[13:]))}
		}
		out = append(out, e)
		p = q + entrySizes[algo]
	}
	return out, nil
}

// unpackBucket is the state of a bucket's 12 bytes (script.lua): the ms
// in 44 bits, then the nano-tokens + 2^51 in 52 bits.
func unpackBucket(s []byte) state {
	h, l := uint48(s), uint48(s[6:])
	return state{a: int64(h%16)<<48 + int64(l) - 1<<51, b: int64(h / 16)}
}

func uint48(b []byte) uint64 {
	return uint64(binary.BigEndian.Uint16(b))<<32 | uint64(binary.BigEndian.Uint32(b[2:]))
}

func uint56(b []byte) uint64 {
	return uint64(b[0])<<48 | uint48(b[1:])
}
