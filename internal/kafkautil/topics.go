package kafkautil

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
)

// TopicSpec describes a topic to create.
type TopicSpec struct {
	// Name of the topic. Required.
	Name string
	// Partitions is the partition count; -1 means the broker's default
	// (num.partitions, Kafka 2.4+). Zero is invalid.
	Partitions int
	// ReplicationFactor; -1 means the broker's default
	// (default.replication.factor, Kafka 2.4+). Zero is invalid.
	ReplicationFactor int
	// Config holds topic-level settings, e.g. "cleanup.policy": "compact".
	Config map[string]string
}

// CompactedTopic returns a spec for a log-compacted topic (the newest record
// per key is kept forever): daily-quota counts, policy records.
func CompactedTopic(name string, partitions, replicationFactor int) TopicSpec {
	return TopicSpec{
		Name: name, Partitions: partitions, ReplicationFactor: replicationFactor,
		Config: map[string]string{"cleanup.policy": "compact"},
	}
}

// RetainedTopic returns a spec for a topic whose records are deleted after
// retention: usage reports.
func RetainedTopic(name string, partitions, replicationFactor int, retention time.Duration) TopicSpec {
	return TopicSpec{
		Name: name, Partitions: partitions, ReplicationFactor: replicationFactor,
		Config: map[string]string{
			"cleanup.policy": "delete",
			"retention.ms":   strconv.FormatInt(retention.Milliseconds(), 10),
		},
	}
}

func (s TopicSpec) validate() error {
	switch {
	case s.Name == "":
		return fmt.Errorf("%w: topic name is empty", ErrConfig)
	case s.Partitions == 0 || s.Partitions < -1:
		return fmt.Errorf("%w: topic %q: partitions %d: want >= 1, or -1 for the broker default", ErrConfig, s.Name, s.Partitions)
	case s.ReplicationFactor == 0 || s.ReplicationFactor < -1:
		return fmt.Errorf("%w: topic %q: replication factor %d: want >= 1, or -1 for the broker default", ErrConfig, s.Name, s.ReplicationFactor)
	}
	return nil
}

// EnsureTopics creates the topics that do not exist yet; a topic that
// already exists is left as it is (its partitions and config are not
// changed) and counts as success. When it returns nil, every writer built
// from c knows every topic (the shared metadata cache has been refreshed).
// A failure names each topic that could not be created.
func (c *Cluster) EnsureTopics(ctx context.Context, specs ...TopicSpec) error {
	if len(specs) == 0 {
		return nil
	}
	req := &kafka.CreateTopicsRequest{}
	for _, s := range specs {
		if err := s.validate(); err != nil {
			return err
		}
		tc := kafka.TopicConfig{Topic: s.Name, NumPartitions: s.Partitions, ReplicationFactor: s.ReplicationFactor}
		for k, v := range s.Config {
			tc.ConfigEntries = append(tc.ConfigEntries, kafka.ConfigEntry{ConfigName: k, ConfigValue: v})
		}
		req.Topics = append(req.Topics, tc)
	}
	resp, err := c.client.CreateTopics(ctx, req)
	if err != nil {
		return fmt.Errorf("kafkautil: create topics: %w", err)
	}
	failed := map[string]error{}
	for name, terr := range resp.Errors {
		if terr != nil && !errors.Is(terr, kafka.TopicAlreadyExists) {
			failed[name] = terr
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("kafkautil: create topics: %w", joinErrs(failed))
	}
	// Topics that already existed were not refreshed by kafka-go's
	// CreateTopics hook; wait until the shared cache knows every one.
	for _, s := range specs {
		if err := RetryUnknownTopic(ctx, DefaultBackoff(), func() error {
			_, err := c.Partitions(ctx, s.Name)
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}
