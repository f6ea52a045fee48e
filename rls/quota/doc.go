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
// ((allowed + denied) / time_elapsed; the larger of the latest report and
// the mean of the latest LowerReports, unless the latest is a significant
// drop), what demand leaves over split equally; the burst, but for
// BurstSparePermille of it, gives each Envoy one request first and the
// rest in proportion to the rates. Every new assignment is a full Envoy
// token bucket, so assignments change only when it is worth it: a rate
// is lowered when the Envoy's reports show its demand significantly
// below it (three standard deviations of a Poisson count, over the latest
// report or the latest LowerReports; one low second of noise is not),
// when its target is the Envoy's max-min fair part below its demand (the
// others need more; TestFairShareLowersAboveItsPart) or when the share no
// longer holds the assignments kept, and raised (beyond
// a quarter of ThresholdPermille) only when the Envoy needs more (it
// denied requests, or its demand is significantly above); other moves
// within ThresholdPermille are not sent. An unchanged assignment is
// extended (the same strategy, which Envoy treats as an extension) once
// half its TTL has passed; a bucket that reported no request for
// IdleTimeout is abandoned; Shutdown sends every live assignment again
// with a TTL of 0 so that Envoys fall back at once.
//
// Invariant: at every instant, the sum over a bucket's Envoys of what each
// may admit stays within the region's share, counting assignments in
// flight and Envoys whose stream ended before their assignment ran out.
// What an Envoy may admit is the rate of the assignment it enforces and
// the bursts it still holds: Envoy starts a new, full token bucket with
// every new strategy (anything but an extension), and the server cannot
// know what the Envoy spent of the buckets before, so every new bucket's
// burst counts until its assignment runs out, on top of the earlier
// ones'. (Counting only the largest burst per Envoy, as before, let 10
// Envoys per region admit 24 % over the limit: every re-send was a fresh
// bucket that nothing counted.) Why it holds:
//
//   - The server reserves every assignment it decides from that instant
//     until TTL + InFlight later. An Envoy starts an assignment's TTL when
//     it receives it, after the server decided it; InFlight bounds that
//     delay. What the server relies on: an assignment reaches its Envoy
//     within InFlight or never, and the Envoy's clock runs at the server's
//     rate. It does not rely on reports as acknowledgements (a report can
//     cross an assignment in flight and carries no assignment id).
//   - An Envoy enforces one assignment at a time, so its rate is at most
//     the largest of its assignments still reserved, and its bursts at
//     most the sum of those that started a bucket (an extension, the same
//     strategy sent InFlight before the one it extends expires on the
//     Envoy, prolongs that grant instead of adding one); a stream that
//     ends, cleanly or not, keeps its reservations until they run out
//     (Envoy keeps enforcing them). A lowered assignment therefore frees
//     capacity for the other Envoys only once the higher one it replaces
//     runs out, and any change of assignment needs room for a new burst:
//     the spare part of the share's burst (BurstSparePermille) is that
//     room. A new bucket that does not fit is cut to what does, or, under
//     one request, not sent (the Envoy keeps the assignment it has, which
//     is reserved); a burst-only raise (of a burst cut earlier) is sent
//     only when it fits whole.
//   - A new assignment outlives every earlier one. Before sending, the
//     core checks it at every instant from now to its end at which the
//     reservations change (now and each expiry): where the new assignments
//     would lift the sum above the share (or above what the sum already
//     is), their raises are cut in proportion until they fit: for the
//     rate, the raise over the Envoy's reservation at that instant; for
//     the burst, the whole burst of a new bucket, and an extension's once
//     the grant it extends would have run out (an extension cut becomes a
//     new bucket and the bursts are checked again). So no decision raises
//     the sum above the share at any present or future instant.
//   - A share that is lowered cannot take back what was granted: the sum
//     is within the new share TTL + InFlight after the change at the
//     latest (and decreases monotonically meanwhile), the same delay as an
//     Envoy that ignores the server. While the bursts held are above the
//     lowered share, no new bucket fits, so lowered assignments are sent
//     only as the older ones run out (an Envoy whose assignment expires
//     meanwhile is on its expired_assignment_behavior until then). Shares
//     are lowered by the coordinator every epoch (10 s by default); keep
//     TTL + InFlight well under it.
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
// own ledger of what was sent, every new bucket's burst counted until it
// runs out. What the bound does not say: a bucket's burst is counted as
// held until its assignment runs out, so over a span longer than TTL +
// InFlight the bursts granted can add up to more than the share's burst
// (at most one share's burst per TTL + InFlight, and only while
// assignments change); the damping above keeps changes rare
// (TestNoisyDemandKeepsAssignments: no new bucket in 100 s of noisy
// steady demand over ten Envoys).
//
// Replicas: with ServerConfig.Claims (RedisClaims on the region's Redis,
// `quotient rls --rlqs-replicas` N > 1) the region's replicas split each
// bucket's share by demand, each splitting its part among the Envoys
// connected to it; without it each splits 1/Replicas (static, no lending).
// Every ShareRefresh, and when a bucket first reports, a replica makes one
// atomic call per active bucket (ReplicaStore.Claim: one WATCH/MULTI
// transaction on the hash ClaimKeyPrefix + bucket): it drops the records
// that expired on the store's clock, computes its part (Allocate: its
// max-min fair target over the live replicas' demand, cut to what the
// others' claims leave of the share) and writes its record: its demand,
// its claim and an expiry Lease = TTL + InFlight + ClaimSlack after the
// store's clock. The claim is the larger of the new part and its ceiling
// (Core.Ceiling: the larger of the part it had and what its Envoys hold
// now), and the part is applied as a lease ending Lease after a time
// taken before the call (Core.SetLeasedShare). Why the sum over the
// replicas and their Envoys stays within the region's share at every
// instant, a replica that died before its record expired and assignments
// in flight included:
//
//   - A replica's Envoys hold no more than its live record's claim, at
//     every instant: under a fixed part the core keeps what it reserves
//     (assignments in flight and those of disconnected Envoys included,
//     as above) within the larger of the part and what was reserved
//     before, and reservations only fall; so from a call on, they stay
//     within the ceiling taken before it (what the old part allows) and,
//     once the new part is applied, within the larger of it and the
//     ceiling: the claim written. A lowered part is therefore written as
//     the old ceiling first, and the record falls only at a later call,
//     once the Envoys' larger assignments ran out.
//   - The records' claims fit in the share: each call writes a claim
//     that fits beside the others' live claims (the part is cut to what
//     they leave; the ceiling is at most the replica's own live record,
//     which fitted when written). A replica whose record expired claims
//     its new part only (its Envoys then hold nothing: next point).
//   - A dead or cut-off replica's Envoys hold nothing once its record
//     expires: the core grants nothing whose reservation (TTL + InFlight)
//     would outlast the lease, extensions included, and the lease ends
//     no later than the record (it starts before the call, the record's
//     expiry at the store's clock during it; clocks may be offset, but
//     must run at the same rate). Until then its claim is counted by the
//     others, so its part is unusable for up to Lease after its last
//     call; a replica that cannot reach the store keeps granting for
//     ClaimSlack, then its Envoys fall back to expired_assignment_behavior.
//   - A restarted replica has a new name (NewReplicaID), so its
//     predecessor's record stays counted until it expires, besides the
//     warm-up above.
//   - The share read may differ between replicas for one ShareRefresh
//     after a change: the sum is then within the largest share read, and
//     a lowered share is reached as the ceilings fall (TTL + InFlight
//     later, plus one call).
//
// What it costs: one store transaction per active bucket per
// ShareRefresh per replica, serialised in the replica; an Envoy whose
// demand moves to another replica gets the capacity after the old
// replica's Envoys' assignments ran out and one more call of each
// (TestReplicasLendThroughRedis measures it). TestReplicasInvariantRandom
// checks the sum from the Envoys' ledger after every event of random runs
// of two or three replicas (reports, demand moving, Envoys moving,
// replicas killed, restarted and cut from the store, time passing).
package quota
