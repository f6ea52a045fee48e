package membership

import "hash/fnv"

// OwnerOf is the replica that owns key part part among the live member
// names alive: the one with the highest rendezvous hash (FNV-1a of the
// name and the part, mixed), ties broken by the smaller name. Every
// replica with the same view names the same owner; when a replica leaves,
// only its parts move, and when one joins, only the parts it now wins.
// "" when alive is empty. Pure.
func OwnerOf(alive []string, part int) string {
	var (
		best  string
		bestH uint64
	)
	for i, name := range alive {
		h := rendezvous(name, part)
		if i == 0 || h > bestH || (h == bestH && name < best) {
			best, bestH = name, h
		}
	}
	return best
}

// OwnedParts are the parts in [0, parts) that name owns among alive
// (OwnerOf), in increasing order; none when name is not in alive.
func OwnedParts(alive []string, name string, parts int) []int {
	var out []int
	for p := range parts {
		if OwnerOf(alive, p) == name {
			out = append(out, p)
		}
	}
	return out
}

// rendezvous is the weight of (name, part): FNV-1a (64 bit) of the name, a
// zero byte and the part's decimal digits, through MurmurHash3's 64-bit
// finalizer (FNV-1a alone varies little in its high bits between close
// inputs).
func rendezvous(name string, part int) uint64 {
	f := fnv.New64a()
	_, _ = f.Write([]byte(name))
	_, _ = f.Write([]byte{0})
	var b [20]byte
	n := len(b)
	for v := part; ; v /= 10 {
		n--
		b[n] = byte('0' + v%10)
		if v < 10 {
			break
		}
	}
	_, _ = f.Write(b[n:])
	h := f.Sum64()
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}
