// Package region is one region's coordinator process: it wires the
// rebalancer (Core and Driver) to this region's Redis (rebalancer/redisio)
// and to Kafka (rebalancer/kafkabus); it wires the replication of global
// fixed windows (daily quotas: dailyquota.Driver over dailyquota/redisio
// and dailyquota/kafkarepl on the topic quotient.daily-quota, mirrored like
// the usage topic when Config.Mirrored) when the policies hold any; and it
// serves an HTTP endpoint with /metrics (Prometheus, on the Coordinator's
// own registry, quotient_coordinator_* and quotient_dailyquota_*) and
// /healthz.
// cmd/quotient's `coordinator` command builds a Config from flags and runs
// a Coordinator until SIGTERM.
//
// What it does not do (yet): the admin API, policy distribution over Kafka
// and memberlist leader election (issue 7) belong here later; today global
// policies come from Config.Policies (the gateways' policy file) and exactly
// one coordinator per region must run, since two would both write shares.
// It computes nothing itself: decisions are the rebalancer Core's and the
// dailyquota package's.
//
// Invariants: a Coordinator owns every client it builds (Redis, Kafka) and
// closes them when Run returns; it keeps no process-global state (its
// metrics live in its own prometheus.Registry, exposed by Registry()).
// Shutdown is graceful: cancelling Run's context stops the epoch loop
// between steps (a write in progress finishes or times out), stops the
// consumer, then shuts the HTTP server down within Config.ShutdownTimeout.
package region
