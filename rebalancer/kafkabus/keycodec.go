package kafkabus

import (
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
	"github.com/quotientlabs/quotient/rebalancer"
)

// The keys of a report, encoded by hand. A full report of a million keys
// spent most of Publish's own CPU in the protobuf runtime's generic
// encoder (sizing every key, then sizing and writing it again), and the
// adapter first copied every key into a KeyUsage for it. KeyUsage is two
// strings and eight scalars: writing them directly, from the wire form or
// straight from a rebalancer.Report's keys, gives the bytes proto.Marshal
// gives (TestKeyUsageCodec) for a fraction of the work. A report with a
// key carrying unknown fields (decoded from a newer sender) goes through
// proto.Marshal, which keeps them.

// Field numbers of quotient.v1.KeyUsage, and of UsageReport.keys.
const (
	fieldPolicyID protowire.Number = 1
	fieldSubject  protowire.Number = 2
	fieldDemand   protowire.Number = 3 // then admitted, smoothed_demand_milli, share and want rate and burst: 4 to 9
	fieldRemoved  protowire.Number = 10

	fieldReportKeys protowire.Number = 9
)

// keyFields is one key as KeyUsage holds it, in field order.
type keyFields struct {
	policy, subject string
	ints            [7]int64 // demand .. want_burst_milli: fields 3 to 9
	removed         bool
}

func fieldsOfProto(k *quotientv1.KeyUsage) keyFields {
	return keyFields{policy: k.GetPolicyId(), subject: k.GetSubject(), removed: k.GetRemoved(),
		ints: [7]int64{k.GetDemand(), k.GetAdmitted(), k.GetSmoothedDemandMilli(),
			k.GetShareRateMilli(), k.GetShareBurstMilli(), k.GetWantRateMilli(), k.GetWantBurstMilli()}}
}

func fieldsOfReport(k *rebalancer.KeyReport) keyFields {
	return keyFields{policy: k.PolicyID, subject: k.Subject, removed: k.Removed,
		ints: [7]int64{k.Demand, k.Admitted, k.SmoothedDemandMilli,
			k.Share.RateMilli, k.Share.BurstMilli, k.Want.RateMilli, k.Want.BurstMilli}}
}

// size returns the key's encoded size, as proto.Size gives it (every
// field number is below 16: one byte of tag).
func (k *keyFields) size() int {
	n := 0
	if k.policy != "" {
		n += 1 + protowire.SizeBytes(len(k.policy))
	}
	if k.subject != "" {
		n += 1 + protowire.SizeBytes(len(k.subject))
	}
	for _, v := range k.ints {
		if v != 0 {
			n += 1 + protowire.SizeVarint(uint64(v))
		}
	}
	if k.removed {
		n += 2
	}
	return n
}

// append appends the key's fields as proto.Marshal writes them (in field
// order, zero values left out). An error, as from proto.Marshal, when a
// string is not valid UTF-8.
func (k *keyFields) append(b []byte) ([]byte, error) {
	var err error
	if b, err = appendString(b, fieldPolicyID, "policy_id", k.policy); err != nil {
		return b, err
	}
	if b, err = appendString(b, fieldSubject, "subject", k.subject); err != nil {
		return b, err
	}
	for i, v := range k.ints {
		if v != 0 {
			b = protowire.AppendTag(b, fieldDemand+protowire.Number(i), protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(v))
		}
	}
	if k.removed {
		b = protowire.AppendTag(b, fieldRemoved, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
	}
	return b, nil
}

// appendString appends string field num unless s is empty.
func appendString(b []byte, num protowire.Number, name, s string) ([]byte, error) {
	if s == "" {
		return b, nil
	}
	if !utf8.ValidString(s) {
		return b, fmt.Errorf("string field quotient.v1.KeyUsage.%s contains invalid UTF-8", name)
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s), nil
}

// keySource is the keys of a report being encoded.
type keySource interface {
	len() int
	// size returns key i's encoded size (without its tag and length in
	// the report); an error when the key cannot be encoded (nil).
	size(i int) (int, error)
	// entry appends key i as an entry of UsageReport.keys: tag, length
	// and its encoding.
	entry(b []byte, i int) ([]byte, error)
	// name returns key i's policy and subject, for errors.
	name(i int) (policy, subject string)
}

// protoKeys is the keys of a UsageReport; generic (proto.Marshal) when a
// key has unknown fields or the Bus says so (Bus.protoKeys).
type protoKeys struct {
	keys    []*quotientv1.KeyUsage
	generic bool
}

func newProtoKeys(keys []*quotientv1.KeyUsage, generic bool) protoKeys {
	for _, k := range keys {
		if generic {
			break
		}
		generic = k != nil && len(k.ProtoReflect().GetUnknown()) > 0
	}
	return protoKeys{keys: keys, generic: generic}
}

func (p protoKeys) len() int { return len(p.keys) }

func (p protoKeys) size(i int) (int, error) {
	k := p.keys[i]
	switch {
	case k == nil:
		return 0, fmt.Errorf("keys[%d] is nil", i)
	case p.generic:
		return proto.Size(k), nil
	}
	f := fieldsOfProto(k)
	return f.size(), nil
}

func (p protoKeys) entry(b []byte, i int) ([]byte, error) {
	b = protowire.AppendTag(b, fieldReportKeys, protowire.BytesType)
	if p.generic {
		b = protowire.AppendVarint(b, uint64(proto.Size(p.keys[i])))
		return proto.MarshalOptions{}.MarshalAppend(b, p.keys[i])
	}
	f := fieldsOfProto(p.keys[i])
	b = protowire.AppendVarint(b, uint64(f.size()))
	return f.append(b)
}

func (p protoKeys) name(i int) (string, string) {
	return p.keys[i].GetPolicyId(), p.keys[i].GetSubject()
}

// reportKeys is the keys of a rebalancer.Report, encoded without a
// KeyUsage for each (Adapter.Publish).
type reportKeys []rebalancer.KeyReport

func (r reportKeys) len() int { return len(r) }

func (r reportKeys) size(i int) (int, error) {
	f := fieldsOfReport(&r[i])
	return f.size(), nil
}

func (r reportKeys) entry(b []byte, i int) ([]byte, error) {
	f := fieldsOfReport(&r[i])
	b = protowire.AppendTag(b, fieldReportKeys, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(f.size()))
	return f.append(b)
}

func (r reportKeys) name(i int) (string, string) { return r[i].PolicyID, r[i].Subject }
