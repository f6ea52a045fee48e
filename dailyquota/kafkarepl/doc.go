// Package kafkarepl carries daily-quota counts (quotientv1.WindowCount)
// between regions over Kafka, with github.com/segmentio/kafka-go through
// internal/kafkautil: it is the dailyquota.Bus of the coordinators.
//
// # Topic layouts
//
// Each region publishes to "quotient.daily-quota" (DefaultTopic), a topic
// with cleanup.policy=compact,delete, 12 partitions and 3 days of retention
// (the settings of deploy/terraform/modules/kafka; a Bus creates its topic
// with them unless Config.SkipCreateTopic). With one shared cluster every
// region consumes that one topic. With one cluster per region and
// MirrorMaker 2, region A consumes its local topic and "<B>.quotient.daily-quota"
// per remote region B: Config.ConsumeTopics = MirroredTopics(DefaultTopic, "B", "C").
// Topics that do not exist yet are waited for.
//
// # Messages
//
// Key = "<subject> <policy> <window start ms> <region>" (the limiter's
// encoded subject never contains a space; policy and region names neither):
// the compaction key, so the topic keeps the latest count of every region
// for every window, and one key's records stay in one partition in order.
// Value = a serialized WindowCount (absolute count; receivers max-merge).
// The record timestamp is the sender's clock.
//
// # Where a consumer starts
//
// Run reads every partition of every consumed topic from its first offset,
// with no consumer group and no committed offsets: a (re)started
// coordinator replays the compacted topic, which holds the latest count of
// every live window (max-merge makes the replay harmless), and drops the
// counts of ended windows. An offset that retention removed restarts the
// partition at its first offset. Publishers refresh unchanged counts
// (dailyquota.PublisherConfig.Refresh, default 1 h), so a window longer
// than the retention (a monthly quota on a 3-day topic) keeps its counts.
//
// # Delivery guarantees
//
// At least once, per key in order, across keys in any order. Publish blocks
// until every record is acknowledged by all in-sync replicas (acks=all) or
// fails; a failed Publish may have sent some records, and sending them again
// is safe.
//
// What it does not do: it does not merge, validate windows or decide
// anything (package dailyquota does), keeps no state across Run calls, and
// logs nothing; malformed records are counted in Stats and skipped.
package kafkarepl
