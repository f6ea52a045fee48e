// Package redisio is the rebalancer's Redis adapter: Source reads the usage
// this region's gateways flushed (limiter.RedisUsageSink's layout, through
// limiter.CollectUsageTotals) as a rebalancer.UsageSource, and Sink writes this
// region's share records (the layout limiter's script reads:
// rl:{<subject key>}:<policy>:share, hash fields r and b in milli units) as a
// rebalancer.ShareSink. PressureSource reads the gateways' pressure marks
// (limiter.UsagePressureKey) and their current usage as a
// rebalancer.PressureSource, for transfers between decisions. All work on
// a standalone Redis and on a Redis Cluster (any redis.UniversalClient).
//
// What it does not do: it decides nothing (the rebalancer Core says what to
// write and when records expire), keeps no state (but PressureSource's
// counts of its last read and Source's lists of big hashes to unlink),
// starts no goroutines and logs nothing. Source does not delete the
// usage it just read (deleting it would race with a gateway's late flush;
// the Core collects an epoch only once, so reading it again changes
// nothing); it unlinks the big usage hashes of the epoch
// UnlinkLagEpochs before, which no gateway writes any more, so that
// redis-server does not free a big usage hash in the foreground when it
// expires (it remembers, per epoch read, which hashes were big; small
// listpack-encoded ones are left to expire). Source reads the packed
// layout and, for a rolling upgrade, the previous release's split layout
// too (NewLayoutSource).
//
// Invariants:
//   - A share record is written atomically with its expiry (inside one Lua
//     script call: HSET r b, then PEXPIREAT), so a record never exists
//     without the expiry the Core chose, even when a write fails half-way.
//     A record the Core deletes (the default share) is removed with DEL in
//     the same kind of call. One call writes up to DefaultKeysPerCall
//     records: consecutive ones on a standalone Redis, those of one slot on
//     a cluster (a script's keys must share a slot); updates of one key are
//     applied in the order given.
//   - Writes are pipelined in batches (NewSink's batch) without
//     transactions; go-redis splits a pipeline per cluster node. Every
//     command is idempotent, so a failed Write may simply be retried with the
//     same updates.
package redisio
