// Package policysync distributes policies and overrides from the admin API
// to every gateway of every region (issue 7, item 3).
//
//	admin.Server ──Append──► KafkaLog ──► quotient.policies (compacted, shared by all regions)
//	                                           │ Follower (every coordinator, from the first offset)
//	                                           ▼
//	                             admin.Catalog ──► Materializer ──► Redis hash quotient:policyset
//	                                                                 + PUBLISH quotient:policyset
//	                                                                        │
//	gateways: Reloader (on the message, and at least every 30 s) ◄──────────┘
//	          ──► limiter.SetPolicies, keeping the last good set
//
// Records are keyed kind/id/version on the topic, so compaction keeps every
// version (the history) and drops only re-sends. Each coordinator replays
// the whole topic at start (it is small: one record per version), so its
// Catalog, history and audit log are complete; it is ready once it has read
// up to the end offsets it found at start (never by waiting for an empty
// fetch). The Follower long-polls (fetches held 5 s at the broker), so a
// change reaches every region one round trip to its broker after the
// write, for brokers up to 1 s away; with the former 100 ms fetch wait a
// broker more than ~25 ms away never answered an idle fetch in time and no
// change arrived.
//
// The Materializer writes one snapshot (every policy in force and every
// override not deleted) with its Catalog generation; a Lua script refuses a
// snapshot older than the one stored, so replicas that lag cannot roll a
// region back, and publishes the generation on the channel when the
// snapshot changed. A Reloader reads the snapshot when notified and every
// Interval (default 30 s, so a lost notification delays a change by at most
// that), parses it with limiter.ParsePolicies and swaps the limiter's set;
// a snapshot that does not parse, or Redis down, keeps the last good set and
// is counted in a metric.
//
// What it does not do: decide requests (package limiter) or validate writes
// (package admin). Overrides reach the gateways through Reloader.Override,
// which a gateway passes as limiter.Config.Overrides (quotient gateway does
// with --policy-source redis).
//
// Invariants: applying a record twice or out of order changes nothing
// (admin.Catalog); a region's snapshot generation never goes down; a
// Reloader never installs a set that did not parse.
package policysync
