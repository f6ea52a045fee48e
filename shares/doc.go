// Package shares computes how much of a global rate limit each region may
// enforce: one pure, deterministic function per key, with integer
// (fixed-point) arithmetic and explicit rounding. It does no I/O, reads no
// clock, uses no randomness, logs nothing and keeps no state; the caller
// (package rebalancer) assembles each region's view and stores the result.
//
// # Units
//
// A key's global limit is a rate L in milli-tokens per second
// (Limit.RateMilli) and a burst B in milli-tokens (Limit.BurstMilli), shared
// by n regions (Limit.Regions). A share is a (rate, burst) pair in the same
// units. Demand is smoothed demand in milli cost units per second. The
// default share, what a region enforces for a key without a share record, is
// Default() = (floor(L/n), floor(B/n)).
//
// # Inputs: one view of one key
//
// For every region (indexed in the caller's order, which must be the order
// of region names, so that every region indexes the same way) a RegionInput
// holds what that region published for the epoch: its smoothed demand, its
// claim (the share it enforced when it published) and its want (how much it
// asked to grow), or Silent when the view has had no report from it for long
// enough (K+1 epochs, or 2K-1 under package rebalancer's majority rule). Rate and burst are handled the same way, each against its own
// limit; the algorithm below is written for the rate.
//
// # Algorithm
//
// Targets (Config.Targets): the max-min fair water-filling of L over the
// regions' smoothed demand.
//
//  1. Silent regions get exactly Default(); the rest, T = L - reserve - the
//     silent regions' defaults, is shared by the others (reserve =
//     L*ReservePermille/1000, left unallocated).
//
//  2. Every live region gets the floor f = Default()*FloorPermille/1000
//     (less if n*f > T), so a quiet region can admit its first requests;
//     the burst floor is at least Limit.MinCostMilli (see Floors).
//
//  3. The rest is water-filled over each region's demand above the floor:
//     the largest level λ with Σ min(d_i - f, λ) <= rest; each region gets
//     min(d_i - f, λ). Equal demands get equal amounts, so no tie-breaking is
//     needed and the result does not depend on the order of the regions.
//     When the key is over its limit (Σ (d_i - f) > rest), only
//     1 - ProportionalPermille of that is water-filled: the other part is
//     split in proportion to d_i - f, each part floored. Both parts are at
//     most d_i - f, so no region gets more than its demand and the sum
//     stays within rest. Max-min alone gives the smaller regions exactly
//     their demand, where random arrivals waste tokens; the ideal global
//     limiter serves every region in proportion to its arrivals.
//
//  4. What is left when every demand is met is split: SpreadPermille of it
//     equally, the rest in proportion to what each region got so far, both
//     in one floored division per region. With no demand at all every
//     target is exactly Default(); this is how idle keys return to default.
//
//  5. Headroom cap: no live region's target exceeds max(Default(),
//     d_i*HeadroomPermille/1000); what the cap cuts stays unallocated, so
//     a region's target agrees with what it keeps at collection (Keep)
//     and shares do not churn.
//
// Every division floors, so Σ targets <= L always; the few milli-tokens
// lost to rounding stay unallocated.
//
// # Floors: one request per region
//
// A burst floor of FloorPermille of Default() alone can be under one
// request: 1.5% of 200/3 tokens is 0.999 tokens, so an idle region that
// gets its first request would admit nothing until the next decision.
// The burst floor is therefore max(Default().Burst*FloorPermille/1000,
// MinCostMilli), the cost of the policy's cheapest request, and the
// reserve never cuts it. It fits: a valid Limit has B/n >= MinCostMilli
// (Validate refuses B < n x MinCostMilli, naming the burst to set), so the
// floor is at most Default() and n floors are at most B. Every share
// Targets, Keep and Next give a live region (and Default(), which needs no
// record) then admits at least one request, given a claim that did: Keep
// keeps max(floor, H*demand) or more, Next in every mode stays at or above
// min(claim, damped target) and a target is never below the floor. A claim
// below the floor (a record written before the floor was raised) is not
// raised without proven slack: it reaches the floor at its next growth.
//
// Keep (Config.Keep), at collection, before the region publishes: a claim
// above max(Default(), H*demand of the epoch just ended) shrinks to
// max(floor, H*demand). It only shrinks, so the published claim stays an
// upper bound of what the region enforces, and the others see the freed
// slack at their decision of the same epoch.
//
// Next share (Config.Next) for region self, from its claim c and damped
// target t = c + (V_self - c)*DampingPermille/1000 (rounded toward c):
//
//   - Shrink before grow: the next share is never above min(c, t) unless the
//     region grows, so a region gives up share at once.
//   - Grow only in Mode Grow (the caller has a complete, timely view of the
//     epoch and is not in fallback), and only into proven slack:
//     slack = L - Σ claims (a Silent region counts as Default()). The region
//     takes at most its part floor(slack * want_self / Σ wants), where the
//     wants are the ones the regions published in their reports for the
//     epoch, and never beyond t. Needs first: when some region that wants
//     published a demand above its claim (it needs), only such regions
//     grow, splitting the slack by floor(slack * want_self / Σ their
//     wants); the others (wanting to return to the default, or asking
//     from a view older than the decision's) wait for the next epoch.
//   - Fallback: the next share is min(c, t, Default()).
//   - No mixed shares: a share is never above the default in one dimension
//     and below it in the other (the dimension above is clamped to the
//     default). The rebalancer gives records above the default a short
//     lifetime and records below it a long one; see package rebalancer.
//
// # Invariants
//
//   - Σ Targets <= L and <= B for every input (floors only).
//   - Permutation: permuting the regions permutes Targets and leaves each
//     region's Next unchanged.
//   - Safety of growth: if every growing region uses the same published
//     wants, claims and demands (a region missing from some view is Silent
//     there, published want 0 and claim <= Default()), then Σ over regions
//     of their Next <= max(L, Σ claims) - and <= L when the claims were
//     within L. The proof: whether a region needs is a function of what it
//     published, so every growing view has the same set of needing regions
//     and the same divisor W (Σ wants of the needing regions if any, else Σ
//     all wants); each region's growth is at most floor(slack*w_r/W), and
//     a region outside the chosen set grows by 0, so all growths together
//     are at most slack. Wants need not be consistent with anything: any
//     published want is safe.
//   - Next never exceeds L (B), never goes negative, and in Fallback never
//     exceeds Default().
//   - Floors: every target of a live region has a burst >= MinCostMilli;
//     Keep and Next keep it there from a claim that was.
//
// # Cost
//
// Targets, Want and Next do not allocate for n <= MaxRegions; BenchmarkCompute1M
// measures one region's computation for 1,000,000 keys of 3 regions.
package shares
