// Package kafkabus carries usage reports (quotientv1.UsageReport) between
// regions over Kafka, with github.com/segmentio/kafka-go. It is the Kafka
// adapter of the rebalancer: Bus.Publish sends this region's report for an
// epoch, and Bus.Run delivers every region's reports (this region's too).
//
// # Topic layouts
//
// One shared cluster: every region's coordinator publishes to and consumes
// from the one topic "quotient.usage" (DefaultTopic) on a cluster all
// regions reach. Config{Topic: "quotient.usage"} (the default) does both.
//
// One cluster per region, mirrored with MirrorMaker 2: each region publishes
// to "quotient.usage" on its own cluster. MirrorMaker 2, with its default
// replication policy and each source cluster aliased by its region name,
// copies region B's topic into region A's cluster as "B.quotient.usage".
// Region A's coordinator then consumes its own local topic plus one remote
// topic per other region:
//
//	Config{Topic: "quotient.usage", ConsumeTopics: MirroredTopics("quotient.usage", "B", "C")}
//	// consumes quotient.usage, B.quotient.usage, C.quotient.usage
//
// A topic that does not exist yet (a mirror not set up yet, a region not yet
// deployed) is waited for: Run polls for it and starts reading once it
// appears. With MirrorMaker 2's IdentityReplicationPolicy (remote topics keep
// their name and all regions land in one local "quotient.usage"), use the
// shared-cluster configuration.
//
// # Messages
//
// Message key = the report's region, so one region's reports stay in one
// partition and in publish order; its partition is the key's hash
// (kafka.Murmur2Balancer). A report with key parts (key_parts > 1) is
// keyed "<region>/<key part>", carries the record header KeyPartHeader
// and goes to partition PartitionOf(key part, the topic's partition
// count), so that each part's consumer (RunPart) reads only its part's
// partition. Value = a serialized UsageReport part.
// The record timestamp is the publisher's clock at Publish (Config.Now).
// A report larger than Config.MaxMessageBytes is split into parts (part,
// parts; every part repeats the header and heard list, keys are divided),
// each part one Kafka message; Run assembles the parts of one (region,
// epoch, seq) and delivers the whole report once all have arrived. The
// publisher creates its topic (cleanup.policy=delete, retention
// Config.Retention, max.message.bytes above MaxMessageBytes) unless
// Config.SkipCreateTopic is set; it never creates the remote (mirrored) topics.
//
// # Where a consumer starts
//
// Run keeps no committed offsets and uses no consumer group: every region
// reads every partition (RunPart: its part's partition, see there). Each partition starts at the first record whose
// timestamp is at or after now - Config.Lookback (default 60 s, six default
// epochs), taken when Run discovers the partition. A (re)started coordinator
// thus sees the recent reports it needs for the current epochs without
// replaying the topic. Parts of a report cut by the start time never
// complete and are dropped (counted in Stats.Evicted).
//
// # What a report costs
//
// With RTT the round trip from a region to the broker (the partition
// leader): Publish returns after one RTT (the produce request and its
// acks=all answer), and the report reaches every other region's Run about
// one RTT after Publish was called: half an RTT to the broker, half an RTT
// back on the fetch each partition reader keeps open at the broker
// (Config.FetchWait) and the broker answers as soon as the report lands.
// Up to one RTT more when no fetch is waiting: the reader's last fetch was
// just answered (empty after FetchWait minus 1 s, or with another region's
// report on the same partition) and its next one is on its way. Run keeps
// the producer ready (Prepare, at start and every Config.WarmInterval), so
// the topic creation, metadata and connection set-up (about seven RTT,
// measured) are not paid inside a Publish's deadline.
// TestReportDeliveryRoundTrips measures this through a delaying proxy.
// kafka-go's reader gives a fetch's answer 1 s to come back, so a round
// trip to the broker must stay below 1 s (else every idle fetch ends in a
// reconnection).
//
// # Delivery guarantees
//
// At least once, per region in order, across regions in any order. The
// producer retries (kafka-go, acks=all) and a restarted consumer re-reads
// the lookback window, so a report can be delivered again. Run suppresses
// duplicates of the reports it recently delivered, but its memory is bounded
// and starts empty on every Run; receivers must therefore still dedupe by
// (region, epoch, seq): keep per region the highest seq applied and drop
// anything at or below it. A report whose parts did not all arrive is never
// delivered (never half a report).
//
// # Transfers
//
// TransferBus carries the asks and gives of share between epoch decisions
// (quotientv1.TransferMessage) on a topic of their own, by default
// TransferTopic(DefaultTopic) = "quotient.usage-transfers", with the same
// layouts (MirroredTopics of it for MirrorMaker 2). Key = the sending
// region; one message per ask (a large ask is split into several asks of
// its keys) or give (a give must fit one message); producer batches of
// TransferConfig.BatchTimeout (2 ms); consumers long-poll every partition
// from TransferConfig.Lookback (10 s) before now. A message that does not
// decode or is not a valid ask or give (CheckAsk, CheckGive) is counted
// (TransferStats.Malformed), passed to TransferConfig.OnMalformed with
// what was wrong, and skipped. TransferAdapter makes it a
// rebalancer.TransferBus. Delivery is at least once; the rebalancer's
// rules make duplicates, reordering and loss safe.
//
// # What it does not do
//
// It does not interpret reports (no shares, no silence detection), keeps no
// state across restarts, starts no goroutines outside Run, Publish and
// Prepare, and logs nothing: counts of dropped and malformed messages and
// failed preparations are in Stats.
package kafkabus
