package kafkautil

import (
	"fmt"
	"time"
)

// BusConfig holds the settings every Quotient bus over Kafka shares (usage
// reports in rebalancer/kafkabus, daily-quota counts in
// dailyquota/kafkarepl), so that they are defaulted and checked in one
// place. A bus keeps these fields in its own exported Config and copies
// them to a BusConfig to call Fill. The zero value is filled by Fill.
type BusConfig struct {
	// Topic the bus publishes to. Required after Fill (from the defaults).
	Topic string
	// ConsumeTopics the bus reads, every partition of each. Default
	// []string{Topic}.
	ConsumeTopics []string
	// Partitions of a topic the bus creates; -1 means the broker's default.
	Partitions int
	// ReplicationFactor of a topic the bus creates; -1 means the broker's
	// default.
	ReplicationFactor int
	// Retention of a topic the bus creates.
	Retention time.Duration
	// TopicPollInterval is how often the consumer looks again for a missing
	// topic or added partitions (ConsumeConfig.PollInterval).
	TopicPollInterval time.Duration
	// Now is the bus's clock (record timestamps, start times). Default
	// time.Now.
	Now func() time.Time
}

// Fill sets each zero field to its value in defaults (ConsumeTopics to
// []string{Topic} when defaults has none, Now to time.Now when defaults has
// none) and rejects bad values with an error that names the field and wraps
// errConfig, the calling package's sentinel (ErrConfig when nil). On error
// b may be partly filled.
func (b *BusConfig) Fill(defaults BusConfig, errConfig error) error {
	if errConfig == nil {
		errConfig = ErrConfig
	}
	if b.Topic == "" {
		b.Topic = defaults.Topic
	}
	if b.Topic == "" {
		return fmt.Errorf("%w: topic is empty", errConfig)
	}
	if len(b.ConsumeTopics) == 0 {
		b.ConsumeTopics = defaults.ConsumeTopics
	}
	if len(b.ConsumeTopics) == 0 {
		b.ConsumeTopics = []string{b.Topic}
	}
	if err := checkTopics(b.ConsumeTopics, errConfig); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		v    *int
		def  int
	}{
		{"partitions", &b.Partitions, defaults.Partitions},
		{"replication factor", &b.ReplicationFactor, defaults.ReplicationFactor},
	} {
		if *f.v == 0 {
			*f.v = f.def
		}
		if *f.v < -1 || *f.v == 0 {
			return fmt.Errorf("%w: %s %d: want >= 1, or -1 for the broker default", errConfig, f.name, *f.v)
		}
	}
	for _, f := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"retention", &b.Retention, defaults.Retention},
		{"topic poll interval", &b.TopicPollInterval, defaults.TopicPollInterval},
	} {
		if *f.v == 0 {
			*f.v = f.def
		}
		if *f.v < 0 {
			return fmt.Errorf("%w: %s %v: must not be negative", errConfig, f.name, *f.v)
		}
	}
	if b.Now == nil {
		b.Now = defaults.Now
	}
	if b.Now == nil {
		b.Now = time.Now
	}
	return nil
}

// MirroredTopics returns the topics a region consumes in the MirrorMaker 2
// layout (default replication policy, source clusters aliased by region
// name): its local topic and "<region>.<topic>" for each remote region.
func MirroredTopics(topic string, remoteRegions ...string) []string {
	out := []string{topic}
	for _, r := range remoteRegions {
		out = append(out, r+"."+topic)
	}
	return out
}
