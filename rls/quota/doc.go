// Package quota serves Envoy's rate limit quota service (RLQS,
// envoy.service.rate_limit_quota.v3.RateLimitQuotaService/
// StreamRateLimitQuotas): Envoys report per-bucket usage on one stream
// and enforce the token-bucket assignments the server pushes back, so no
// request waits on the server or on Redis.
//
// Buckets: a bucket_id (a map) is identified by its canonical encoding
// (rls.BucketKey: domain and entries in sorted key order), so the order of
// its keys never makes two buckets. Its entries are matched as the entries
// of one RLS descriptor of the stream's domain (rls.Config.LookupBucket:
// the path of the descriptor tree that uses every entry once), so the
// same configuration files serve RLS and RLQS. A rule of
// requests_per_unit per unit is a limit L of that rate with a burst B of
// one window's requests; unlimited rules are ALLOW_ALL and
// requests_per_unit 0 is DENY_ALL. A rule naming a Quotient policy takes
// the policy's rate and burst (or limit per window); a shadow policy is
// ALLOW_ALL.
//
// Shares: a region enforces its share of L: the coordinator's share record
// of the rule's policy and the bucket's descriptor subject
// (limiter.ShareKey, read every ShareRefresh), or the default, L/n and
// B/n over the n regions of the region set. Every report's allowed and
// denied counts are added to the region's usage in the gateways' layout
// (limiter.UsageSink), so coordinators see RLQS traffic as gateway
// traffic.
//
// Split (Core, pure: no I/O, no clock, no goroutine): the share's rate is
// divided max-min fair over the demand the Envoys of the bucket report
// ((allowed + denied) / time_elapsed), what demand leaves over split
// equally; the burst gives each Envoy one request first and the rest in
// proportion to the rates. An assignment is re-sent when its target moves
// by more than ThresholdPermille, extended (the same strategy, which Envoy
// treats as an extension) once half its TTL has passed otherwise; a
// bucket that reported no request for IdleTimeout is abandoned; Shutdown
// sends every live assignment again with a TTL of 0 so that Envoys fall
// back at once.
//
// Invariant: at every instant, the sum over a bucket's Envoys of what each
// may admit (the rate and the burst of the assignment it enforces) stays
// within the region's share, counting assignments in flight and Envoys
// whose stream ended before their assignment ran out. Why it holds:
//
//   - The server reserves every assignment it decides from that instant
//     until TTL + InFlight later. An Envoy starts an assignment's TTL when
//     it receives it, after the server decided it; InFlight bounds that
//     delay. What the server relies on: an assignment reaches its Envoy
//     within InFlight or never, and the Envoy's clock runs at the server's
//     rate. It does not rely on reports as acknowledgements (a report can
//     cross an assignment in flight and carries no assignment id).
//   - An Envoy enforces one assignment at a time, so it admits at most the
//     largest of its assignments still reserved; a stream that ends,
//     cleanly or not, keeps its reservations until they run out (Envoy
//     keeps enforcing them). A lowered assignment therefore frees capacity
//     for the other Envoys only once the higher one it replaces runs out.
//   - A new assignment outlives every earlier one. Before sending, the
//     core checks it at every instant from now to its end at which the
//     reservations change (now and each expiry): where the new assignments
//     would lift the sum above the share (or above what the sum already
//     is), their raises over their own Envoy's reservation at that instant
//     are cut in proportion until they fit. So no decision raises the sum
//     above the share at any present or future instant.
//   - A share that is lowered cannot take back what was granted: the sum
//     is within the new share TTL + InFlight after the change at the
//     latest (and decreases monotonically meanwhile), the same delay as an
//     Envoy that ignores the server. Shares are lowered by the coordinator
//     every epoch (10 s by default); keep TTL + InFlight well under it.
//   - A new process cannot know what a previous one granted (a crash
//     sends no TTL 0): it grants nothing for TTL + InFlight after start
//     (Core.WarmUp, ServerConfig.SkipWarmUp), relying on the previous
//     process having used no longer TTL + InFlight.
//   - Amounts are integer milli units; every division rounds down, and the
//     wire encoding (Strategy) rounds the burst down to whole requests and
//     the rate down (fill_interval rounded up to the nanosecond).
//
// TestCoreInvariantRandom checks it after every event of random sequences
// (subscribe, report, disconnect, share change, time passing) from its
// own ledger of what was sent. One limitation follows from Envoy: a new
// strategy replaces Envoy's token bucket with a full one, so every change
// of assignment can let an Envoy spend up to a fresh burst; the threshold
// keeps changes rare.
//
// Replicas: the split is per process and the replicas do not talk to
// each other. With ServerConfig.Replicas = N, each of the region's N
// replicas splits 1/N of the share among the Envoys connected to it, so
// the region stays within its share wherever an Envoy's stream lands (and
// when it moves: a moved Envoy's old assignment is reserved by the replica
// that made it). The cost is capacity: a replica with few Envoys cannot
// lend its part to a busy one. Coordinating replicas through the region's
// Redis is not built.
package quota
