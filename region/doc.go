// Package region is one region's coordinator process: it wires the
// rebalancer (Core and Driver) to this region's Redis (rebalancer/redisio)
// and to Kafka (rebalancer/kafkabus: the usage reports, and the asks and
// gives of share between decisions on Config.TransferTopic unless
// Config.NoTransfers); it wires the replication of global
// fixed windows (daily quotas: dailyquota.Driver over dailyquota/redisio
// and dailyquota/kafkarepl on the topic quotient.daily-quota, mirrored like
// the usage topic when Config.Mirrored); and it serves one HTTP listener
// with /metrics (Prometheus, on the Coordinator's own registry,
// quotient_coordinator_* and quotient_dailyquota_*), /healthz, /readyz and,
// with Config.AdminTokens, the admin API (package admin) under /v1/.
// cmd/quotient's `coordinator` command builds a Config from flags and runs
// a Coordinator until SIGTERM.
//
// Transport security (issue 18): Redis and Kafka connections use
// Config.RedisTLS / RedisUsername / RedisPassword and KafkaTLS / KafkaSASL;
// the HTTP listener serves TLS only with Config.ListenTLS (a
// tlsconfig.Reloader's, so certificates rotate without a restart), and with
// AdminClientCert the admin API also requires a verified client
// certificate while /metrics and the health endpoints do not. Invariant:
// the admin API never serves plaintext on a non-loopback address unless
// Config.AdminInsecure says so (New refuses), because its bearer tokens
// would cross the network in the clear.
//
// Control plane (issue 7):
//   - Policies. With Config.PolicyLog the coordinator replays the compacted
//     topic quotient.policies into an admin.Catalog (policysync.Follower),
//     materialises the policies in force into the region's Redis for the
//     gateways (policysync.Materializer, on every replica: the snapshot is
//     generation-guarded), and shares and replicates the global policies of
//     the log as soon as it holds any record; until then, and without the
//     policy log, Config.Policies (the --policies file) is the set. The
//     rebalancer reads limits through an atomic map swapped on every
//     change; the daily-quota replication restarts when its windows change.
//   - Replicas. With Config.Gossip the replicas of a region form a
//     memberlist cluster (package membership); the epoch loop and the
//     daily-quota replication run only while this replica leads
//     (membership.RunWhileLeader). Every replica, a single one too, claims
//     each epoch in the region's Redis (membership.Fence) before collecting
//     it, so an epoch is collected and its report published once, and a
//     new term resumes at the epoch after the last claimed one, catching up
//     on those whose usage is still in Redis (rebalancer.DriverConfig.Fence).
//     A new term starts a new rebalancer Core, which publishes no report
//     during its warm-up (rebalancer.Config.WarmupEpochs): that is the
//     rebalancer's rule for records the previous leader wrote, not a gap in
//     the claimed epochs. A takeover adopts the records instead (no
//     warm-up), and a first start skips it: when the usage topic
//     holds no report of this region of the last
//     rebalancer.FirstStartEpochs epochs (kafkabus.Bus.Published; see the
//     rebalancer package doc, "First start").
//
// Parts (issue 15). With Config.Parts = P > 1 the key space is split into
// P parts: a key's part is limiter.UsagePart, its usage shard modulo P (so
// Config.UsageShards must be a multiple of P, and the part is the same in
// every region whatever its shard count), and P is the same in every
// region. Each part is an independent instance of the protocol: its own
// rebalancer Core and Driver, reading only its part's usage shards
// (limiter.UsageLayout.Parts), writing only its keys' share records,
// adopting only its keys' records on a takeover, claiming its epochs in
// its own fence (membership.NewPartFence, a Redis key per region and
// part) and publishing its own reports, marked with key_part and
// key_parts (absent: part 0 of 1, the wire format without parts). A
// receiver hands a report only to the Core of its part
// (kafkabus.NewPartAdapter) and refuses, counts
// (quotient_coordinator_reports_parts_mismatch_total) and logs once a
// report of another P. Safety holds per part as without parts: the
// argument for Σ ≤ L is per key, and a part's reports from every region
// cover exactly that part's keys, so each key is decided by one Core per
// region, from every region's claims on it, as with one part.
//
// With Gossip, each live replica runs the parts for which it has the
// highest rendezvous hash over the live members (membership.OwnerOf),
// rechecked every 100 ms; a part that moves starts through its fence and
// the warm-start rules of a new leader (it resumes after the part's last
// claimed epoch and adopts the part's records once the previous owner can
// no longer write). While views disagree two replicas may run one part
// for a moment: the fence lets only one claim each epoch, the other stops
// (rebalancer.ErrFenced) and retries a second later. The daily-quota
// replication stays on the leader (the smallest live name). Without
// Gossip a replica runs Config.StaticParts (all by default).
//
// Each part's reports go to partition PartitionOf(part, n) of the usage
// topic (n its partition count; the coordinator creates the topic with
// max(3, P) partitions, so each part has its own), and each part's
// consumer reads only that partition of each consumed topic
// (kafkabus.Bus.RunPart), plus the partitions no part's reports land on
// when n > P: a replica running k parts fetches about k/P of the topic.
// An existing topic with fewer partitions than P keeps its count (Kafka
// does not shrink or re-create it): parts then share partitions, each
// consumer still keeps only its part's messages (by key), correct but less
// split; add partitions (kafka-topics --alter) to split it fully, a
// consumer finds them within its poll interval. Reports of a region
// without parts (or with another P) land on their key's hash partition,
// which exactly one part's consumer reads when n >= P: the mismatch is
// refused and counted by the replica running that part, not by every
// replica of the region.
// Coordinators of an older version with P > 1 placed parts by key hash:
// while a fleet is upgraded, their reports may land where an upgraded
// part's consumer does not read, and that region looks silent to the
// part (safe, the silence rule) until it is upgraded too.
//
// Transfers between decisions run per part too: each part's driver reads
// the pressure marks and keeps its part's keys, and takes only its part's
// keys of every ask and give (a message with none is dropped); a give's
// giver lowered and wrote every key before sending it, so a part raises
// only what was given for its own keys.
//
// What P > 1 does not do (yet): each part's driver reads every pressure
// mark and every transfer message and keeps its own (a replica running k
// parts reads them k times), and the gateways' wake token wakes one of
// them (the others read at their interval); a first start looks for any
// report of the region, of any part, so a part that
// finds another part's report warms up (safe, slower); the metrics of
// the epoch loop (keys, epoch durations, decisions) are the sum or the
// last of the parts this replica runs, and /healthz lists each part.
//
// What it does not do: it computes nothing itself (decisions are the
// rebalancer Core's and the dailyquota package's; admin writes are the
// admin package's); the admin API's key usage reads only this region's
// Redis; regions do not gossip with each other.
//
// Invariants: a Coordinator owns every client it builds (Redis, Kafka) and
// closes them when Run returns; it keeps no process-global state (its
// metrics live in its own prometheus.Registry, exposed by Registry()); at
// most one term of the epoch loop (of each part) runs in a replica at a time. Shutdown is
// graceful: cancelling Run's context stops the epoch loop between steps (a
// write in progress finishes or times out) and the policy follower, leaves
// the gossip cluster (announced), shuts the HTTP server down within
// Config.ShutdownTimeout (admin writes in flight reach the log first), then
// flushes and closes the Kafka writers.
package region
