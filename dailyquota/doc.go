// Package dailyquota replicates fixed-window quotas (daily, monthly, any
// fixed window) across regions (issue 6, DESIGN.md section 3).
//
// The limiter (limiter/replicated.go) keeps, for a fixed_window policy with
// scope global, one hash per subject and policy in the subject's slot with
// the window start, every region's admitted count and this region's
// optional cap; its script increments this region's count and admits when
// the sum over regions plus the cost stays within the limit (and this
// region's count within its cap). This package moves the counts between
// regions and sets the caps:
//
//   - window.go: window maths in UTC. Fixed(d) cuts windows of length d
//     aligned to the Unix epoch (Fixed(Day) is the UTC day: Unix time has
//     no leap seconds); Month() cuts UTC calendar months.
//   - replicate.go: Count, the unit of replication (one region's absolute
//     count for one subject, policy and window; Kafka compaction key
//     (subject, policy, window, region)); Publisher, which decides what to
//     publish (counts that grew since last acknowledged, and a periodic
//     refresh); Accept, what a receiver merges (valid, aligned, window not
//     over).
//   - split.go: Caps, the remainder split.
//   - driver.go: Driver, the thin shell (goroutines, timer) over a Store
//     (Redis, dailyquota/redisio), ActiveKeys (the gateways' usage counts,
//     dailyquota/redisio) and a Bus (Kafka, dailyquota/kafkarepl).
//
// What it does not do: it does not decide requests (the limiter does), it
// does not count (the limiter's script does), and Window, Publisher, Accept
// and Caps do no I/O and read no clock: they take now.
//
// # Consistency model
//
// Each region's count is a grow-only counter within a window, owned by that
// region; every other region keeps the largest value it has received (a
// state-based G-counter). Merging is idempotent, commutative and
// associative, so duplicated, reordered, replayed or re-published counts
// change nothing, and once every region has received every region's latest
// count, all views are equal to the true totals. A count for an older window
// than the stored one is dropped; a newer window replaces the stored one
// (the windows of one policy are aligned the same in every region). Counts
// of ended windows are dropped by receivers (Accept, after Grace) and by
// Redis (the hash expires one second after the window).
//
// # Overshoot bound
//
// Let D be the replication lag: the longest time between an admission in
// one region and its count reaching every other region's Redis (publish
// interval + usage discovery + Kafka + merge; while a region is cut off, D
// grows with the cut). Every admission in region s checked
// own + Σ_{r≠s} c_r(as seen, at most D old) + cost <= L. Take the region s
// whose last admission came last, at t: every other region r admitted
// nothing after t, and s's check saw r's count as of t-D at the latest, so
//
//	total admitted <= L + Σ_{r≠s} (what r admitted in (t-D, t]).
//
// The overshoot is at most what the other regions admit during one lag.
// With the remainder split it is bounded further: once the remainder falls
// to SplitConfig.BelowPermille of the limit, each region r also enforces a
// cap = its count + its part of the remainder (split by the admissions so
// far, the demand every region sees alike). A region recomputes its cap
// only when another region's count changes, so a region cut off from the
// others stops at its cap, and the overshoot during a partition is at most
// the cut-off region's part of the remainder (plus the lag term above for
// the admissions in flight when the caps were computed), instead of up to
// the whole remainder per region.
//
// # Invariants
//
//   - Counts only grow within a window; a receiver never lowers a count.
//   - Caps(limit, regions, counts) sums to exactly the limit (or to Σ counts
//     when they already reach it) and is the same in every region given the
//     same counts.
//   - The Publisher offers again every count the bus did not acknowledge.
package dailyquota
