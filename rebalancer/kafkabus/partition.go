package kafkabus

import (
	"bytes"
	"strconv"

	"github.com/segmentio/kafka-go"
)

// KeyPartHeader is the Kafka record header that carries a report's key
// part (decimal ASCII) on every message of a report with key_parts > 1. The
// Bus's producer places such a message on partition PartitionOf(key part,
// the topic's partition count) instead of hashing its key; messages without
// it (reports without parts, transfers) keep the key-hash placement
// (kafka.Murmur2Balancer, kafkautil's default).
const KeyPartHeader = "quotient-key-part"

// PartitionOf is the partition that carries the reports of key part
// keyPart on a topic of partitions partitions: keyPart mod partitions.
// When the topic has at least as many partitions as there are parts, each
// part has a partition of its own; with fewer, several parts share one
// (their consumers still keep only their own part's messages, by key). It
// panics if partitions < 1 or keyPart < 0 (a programmer error).
func PartitionOf(keyPart, partitions int) int {
	if partitions < 1 || keyPart < 0 {
		panic("kafkabus: PartitionOf(" + strconv.Itoa(keyPart) + ", " + strconv.Itoa(partitions) + ")")
	}
	return keyPart % partitions
}

// partPartitions is what a consumer of key part part of parts reads on a
// topic of partitions partitions (RunPart): the part's own partition,
// PartitionOf(part, partitions), and the partitions that no part's
// reports are placed on (q >= parts, when the topic has more partitions
// than there are parts) with q mod parts == part. So every partition of
// the topic is read by at least one part's consumer, and a report of a
// sender without parts (or with another part count), placed by key hash,
// still reaches some part of every region, which refuses it
// (ErrPartsMismatch). Sorted.
func partPartitions(part, parts, partitions int) []int {
	out := []int{PartitionOf(part, partitions)}
	for q := parts + part; q < partitions; q += parts {
		out = append(out, q)
	}
	return out
}

// partBalancer places the messages that carry KeyPartHeader on
// PartitionOf of their key part, and the others as fallback does. Safe
// for concurrent use when fallback is (kafka-go calls it from
// WriteMessages).
type partBalancer struct {
	fallback kafka.Balancer
}

// Balance implements kafka.Balancer. partitions is kafka-go's list of the
// topic's partitions (0 .. n-1, in order).
func (b partBalancer) Balance(msg kafka.Message, partitions ...int) int {
	if kp, ok := keyPartOf(msg.Headers); ok && len(partitions) > 0 {
		return partitions[PartitionOf(kp, len(partitions))]
	}
	return b.fallback.Balance(msg, partitions...)
}

// keyPartOf returns the key part in headers' KeyPartHeader, if there is
// one that parses as a key part (0 <= part < maxKeyParts).
func keyPartOf(headers []kafka.Header) (int, bool) {
	for _, h := range headers {
		if h.Key != KeyPartHeader {
			continue
		}
		kp, err := strconv.Atoi(string(h.Value))
		if err != nil || kp < 0 || kp >= maxKeyParts {
			return 0, false
		}
		return kp, true
	}
	return 0, false
}

// keyPartHeaders returns the headers of the messages of a report of key
// part keyPart of keyParts: KeyPartHeader when keyParts > 1, none
// otherwise.
func keyPartHeaders(keyPart, keyParts int32) []kafka.Header {
	if keyParts <= 1 {
		return nil
	}
	return []kafka.Header{{Key: KeyPartHeader, Value: strconv.AppendInt(nil, int64(keyPart), 10)}}
}

// partKeyFilter returns the message-key filter of key part part's consumer
// (RunPart): it skips, undecoded, the messages keyed "<region>/<n>" with n
// another part of this part count (0 <= n < parts, n != part); it keeps
// its own part's messages, keys without a part (senders without parts) and
// parts beyond parts (senders with more parts), so that a report of
// another part count is still decoded and refused.
func partKeyFilter(part, parts int) func(key []byte) bool {
	return func(key []byte) bool {
		i := bytes.LastIndexByte(key, '/')
		if i < 0 || i == len(key)-1 {
			return true
		}
		n := 0
		for _, c := range key[i+1:] {
			if c < '0' || c > '9' || n > maxKeyParts {
				return true
			}
			n = n*10 + int(c-'0')
		}
		return n == part || n >= parts
	}
}
