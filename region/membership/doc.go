// Package membership makes the coordinator replicas of one region a
// cluster (github.com/hashicorp/memberlist, SWIM gossip) and elects the one
// that leads the epoch loop and the replication.
//
// The leader is a pure function of the membership view: the live member
// with the smallest name ([LeaderOf]). When the leader dies, the others
// declare it dead after memberlist's failure detection (probe interval,
// then the suspicion timeout) and the next smallest name takes over; a
// graceful Leave hands over at once.
//
// Views can briefly disagree (during failure detection, or in a
// partition), so two replicas may both believe they lead. [Fence] makes
// that harmless for the epoch loop: a replica publishes epoch e only after
// claiming it in the region's Redis, atomically, with e above the last
// claimed epoch; so no epoch is published twice. A new leader resumes at
// the epoch after the last claimed one (the usage of the epochs it missed
// is still in Redis for the usage TTL), so no epoch is skipped.
//
// What it does not do: run the epoch loop itself (RunWhileLeader runs the
// caller's function), or carry liveness between regions.
//
// Invariants: LeaderOf is deterministic; Fence.Claim succeeds at most once
// per (region, epoch), and only in increasing epoch order.
package membership
