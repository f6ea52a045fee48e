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
// What it does not do: it computes nothing itself (decisions are the
// rebalancer Core's and the dailyquota package's; admin writes are the
// admin package's); the admin API's key usage reads only this region's
// Redis; regions do not gossip with each other.
//
// Invariants: a Coordinator owns every client it builds (Redis, Kafka) and
// closes them when Run returns; it keeps no process-global state (its
// metrics live in its own prometheus.Registry, exposed by Registry()); at
// most one term of the epoch loop runs in a replica at a time. Shutdown is
// graceful: cancelling Run's context stops the epoch loop between steps (a
// write in progress finishes or times out) and the policy follower, leaves
// the gossip cluster (announced), shuts the HTTP server down within
// Config.ShutdownTimeout (admin writes in flight reach the log first), then
// flushes and closes the Kafka writers.
package region
