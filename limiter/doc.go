// Package limiter decides whether a request may proceed under a set of rate
// limit policies. Gateways embed it.
//
// A [Limiter] identifies the subjects of a request (API key, account, user,
// IPv4 address or IPv6 /64 prefix, see [Identity] and [Subject]), selects the
// policies that match it (tier, route, method), and evaluates all policies of
// the request atomically in a [Store]: the [RedisStore] runs one Lua
// script with Redis server time, the [MemoryStore] runs the same algorithms in
// process with the time given as a parameter. The two agree decision for
// decision; a differential test against a real redis-server proves it.
//
// # Algorithms
//
// Five algorithms, chosen per policy (see [Algorithm]):
//
//   - token_bucket: rate_per_sec tokens per second up to burst; a request of
//     cost c is admitted when at least c tokens are left.
//   - leaky_bucket: a queue of capacity burst drained at rate_per_sec
//     (shaping). An admitted request carries the delay to wait before it is
//     forwarded: the time for the work queued ahead of it to drain.
//   - fixed_window: at most limit cost units per window of window_s seconds,
//     aligned to the Unix epoch, so 86400 is the UTC day; or, with window
//     "month" instead of window_s, per UTC calendar month (the 1st at 00:00
//     UTC to the 1st of the next month, 28 to 31 days). Retry and reset run
//     to the window's end: for a month, until the next month starts.
//   - sliding_window_log: exact; at most limit cost units in any window of
//     window_s seconds ending now. Memory and time are O(limit), so its
//     limit is at most 1,000 (MaxSlidingLogLimit); keep it for low limits
//     such as logins.
//   - sliding_window_counter: the weighted estimate
//     n_prev*(1-e/w) + n_curr of the seed design (section 7.2).
//
// # Arithmetic
//
// All state is integer. A bucket is the nano-tokens it held (free queue
// space, for a leaky bucket) at a millisecond (rates are kept to 1/1000
// token per second, so a microsecond of refill is a whole number of
// nano-tokens), so a change of rate or burst (a share, an override, an
// edit) carries the tokens that were left; rate 0, which only a share
// record can set, refills nothing (see algorithm.go). Windows count cost
// units in milliseconds. Divisions happen only where a time is derived
// (retry-after, reset, delay), in IEEE double
// arithmetic in the same order in Lua and Go, so both stores give
// bit-identical answers. Calendar months are cut with integer
// days-from-civil arithmetic (internal/calendar), which the script repeats
// in doubles, exactly. The bounds this imposes (rate at most 1e9/s, burst
// at most 1e6, window limits at most 1e12, sliding_window_log limits at
// most 1,000) are checked when policies are parsed.
//
// # All or nothing across subjects
//
// The policies of one request are evaluated together, across all its
// subjects (an API key's burst and its account's quota): if any enforced
// policy rejects, no policy of any subject consumes anything, so a
// rejected request never spends another policy's allowance. Shadow-mode
// policies are evaluated and reported ("would reject") but never reject;
// they consume only when the request is admitted and they would have
// admitted it themselves. The MemoryStore and a Redis node decide the
// whole request in one atomic step; on a Redis Cluster whose nodes split
// the request's subjects, RedisStore decides them in order and refunds
// (see refund.go for the window a concurrent observer can see and what is
// exact). The deny cache and the fallback answer for the whole request
// too. CheckSubjectsInto takes several subjects chosen by the caller (an
// RLS server's descriptors) and applies the same rule.
//
// A cost of 0 peeks: the policies are evaluated and reported, nothing is
// consumed and nothing is written.
//
// # Resilience (remote stores)
//
// Around the RedisStore, Check adds what a gateway needs so that a failing
// Redis never hangs or fails the API (seed design 7.4, 7.6); see Config for
// every knob and its default:
//
//   - a deadline per store call (Config.Deadline, 5 ms): the call runs in
//     its own goroutine and is abandoned when the deadline passes;
//   - a circuit breaker (BreakerConfig: opens at 50% errors over 10 s with
//     at least 20 calls, probes again after 5 s);
//   - fallbacks while the store cannot answer, by each policy's
//     on_store_failure: open (the policy's own algorithm run in process at
//     twice its rate and burst, or limit, per gateway), local (rate and
//     burst, or limit, divided by Config.Instances), closed (rejected,
//     FailedClosed set; the HTTP layer answers 503). Each algorithm keeps
//     its shape: a leaky bucket still delays what it admits (an in-process
//     queue at the fallback rate, Decision.Delay), a fixed window counts in
//     the same UTC windows and calendar months, a sliding window counter
//     keeps its window; a sliding window log falls back to a sliding window
//     counter of the same window (bounded memory). In-process state starts
//     empty when the store fails: what the store had already counted is
//     not known;
//   - a local deny cache: a subject the store rejected is rejected in
//     process until its retry time, with no store call (cost-aware: a
//     rejection of cost c rejects costs >= c).
//
// Before a server built on a RedisStore reports ready it should warm it:
// (*RedisStore).Warm opens the connections and loads the scripts on every
// node, and a Warmer keeps them loaded across Redis restarts and
// failovers (warm.go), so that no decision pays for a dial or a script
// load and misses its deadline.
//
// Decision.Source says which path answered. Check never returns a store
// error (the fallback answers). The raw paths without any of this (one
// store call at a given time, or the fallback on its own), which the
// simulator and the coordinator's usage endpoint use, are not part of this
// API: they live in this module's internal/rawcheck. The MemoryStore cannot
// fail and skips the layer.
//
// # Usage of global policies
//
// For scope "global" policies Check counts, per policy and subject, the
// demand (every attempt, admitted or not, deny-cache and fallback answers
// included) and the admitted cost; a UsageFlusher writes the counts every
// second to the region's Redis (RedisUsageSink: hashes qv:{<epoch>:<shard>})
// and the coordinator reads one epoch's totals with CollectUsage.
//
// # Keys
//
// Every store key carries the subject as a Redis Cluster hash tag,
// rl:{<subject>}:<policy>:<algorithm>, so all policies of one subject share
// one cluster slot. Subjects are escaped (see [Subject.Key]) so no byte
// string can break a key, move it to another slot, or collide with another
// subject. Every key has a TTL: a bucket lives until it would be full again
// at the rate of its last write (at rate 0: at the policy's own rate) plus
// one second, a window until it ends (a month: until the next month
// starts) plus one second, so an expired key and a live one decide alike
// while the rate stays what it was. On Redis a key may live up to two
// seconds longer than that, never less: a write keeps the key's expiry
// while it is long enough (SET ... KEEPTTL after a PTTL costs Redis less
// than a new expiry on every write, see script.lua) and otherwise writes
// one a second longer than it needs. Within those two seconds a bucket
// whose rate fell since its last write reads its state at the new rate
// rather than as full; windows decide alike either way. A token bucket takes 120 bytes of
// Redis memory with a 32-character API key (MEMORY USAGE, Redis 7.0): a
// 12-byte value, 16 bytes more than the single integer buckets kept before
// they carried their tokens across rate changes.
package limiter
