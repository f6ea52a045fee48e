// Package kafkautil is the Kafka plumbing Quotient's Kafka adapters share
// (usage reports in rebalancer/kafkabus, daily-quota counts in
// dailyquota/kafkarepl, policy distribution): one Cluster per Kafka
// cluster, from which writers, partition readers, the consumer loop and
// topic administration are built consistently with
// github.com/segmentio/kafka-go.
//
// What it does:
//   - Writers with acks=all, millisecond batch timeouts, a byte bound on
//     batches and lz4 compression (NewWriter).
//   - A Producer per bus topic: one Writer, the topic created before the
//     first write unless it is managed elsewhere, unknown topics retried;
//     Prepare does the topic, metadata and leader connections ahead of the
//     first write, so that write costs one produce round trip.
//   - Idempotent topic creation through kafka.Client.CreateTopics, with
//     per-topic config (compacted or time-retained); "already exists" is
//     success (EnsureTopics).
//   - Partition discovery and start offsets by timestamp (Partitions,
//     OffsetsAt), and single-partition readers (NewPartitionReader) whose
//     Close does not wait for the fetch the broker holds.
//   - A bounded retry for UnknownTopicOrPartition (RetryUnknownTopic).
//   - The consumer loop of a bus (ConsumeTopics): every partition of a list
//     of topics (or those ConsumeConfig.Select chooses from each topic's
//     partition count), one reader goroutine per partition, start offsets chosen
//     by the caller (FirstOffsets, Cluster.StartAt) and asked again when
//     retention removed a reader's offset, topics and partitions that appear
//     later found by polling with a capped backoff, messages handed to the
//     caller's goroutine one at a time, the first error stopping everything.
//   - Transport security: every connection of a Cluster (its Transport,
//     its readers' Dialer) uses Config.TLS and Config.SASL; NewSASL builds
//     PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512, and Cluster.Check tells a
//     TLS failure, a refused SASL authentication and an outage apart at
//     start-up. AWS MSK IAM (SASL OAUTHBEARER with a token from AWS's
//     signer) is in the subpackage mskiam, so that only the binaries that
//     offer it link the AWS SDK.
//   - The settings every bus shares, defaulted and checked in one place
//     (BusConfig.Fill), and the MirrorMaker 2 topic names (MirroredTopics).
//
// Metadata caching: kafka-go's Transport answers metadata requests from a
// cache refreshed every MetadataTTL (kafka-go's default is 6 s), so a topic
// created elsewhere can stay unknown to a Writer for that long. A Cluster
// therefore shares ONE Transport between its kafka.Client and every Writer
// it builds: a topic created through EnsureTopics refreshes that shared cache
// before EnsureTopics returns, and writers see it at once. Topics created by
// other processes become visible within Config.MetadataTTL (default 1 s);
// RetryUnknownTopic covers that window.
//
// What it does not do: no consumer groups, no offset commits, no
// goroutines of its own beyond kafka-go's connection management and those
// ConsumeTopics starts and stops before it returns, no decoding of
// messages, no logging, no global state (it never uses
// kafka.DefaultTransport).
//
// Invariants: every writer built here waits for all in-sync replicas
// (RequiredAcks = all) and never creates topics implicitly
// (AllowAutoTopicCreation = false); topic creation is explicit.
// ConsumeTopics calls its handler from the caller's goroutine only, and
// never returns while a goroutine it started still runs. Every reader built
// here (NewPartitionReader, ConsumeTopics) long-polls: its fetch is held at
// the broker up to ReaderConfig.MaxWait, default DefaultFetchWait (5 s),
// never below MinFetchWait (2 s), because kafka-go makes that wait the
// fetch's deadline and keeps only min(1 s, wait/4) for the round trip (at
// the former 500 ms default no record came from a broker more than ~125 ms
// away); and no reader's Close or stop waits for that held fetch (its
// connections are closed first).
package kafkautil
