// Package admin is the coordinator's control plane core and its admin HTTP
// API (issue 7, seed design 4.1 and 9.2).
//
// # What it does
//
// A [Catalog] holds every version of every policy and override as
// [Record] values, and the audit log derived from them. It is a pure state
// machine: [Catalog.Apply] adds one record and does no I/O and reads no
// clock. Records come from the durable log (the compacted Kafka topic
// quotient.policies, see package policysync) and from this coordinator's own
// writes; applying a record twice, or records in any order, gives the same
// state, because a (kind, id) keeps a set of versions and the version in
// force is the highest one.
//
// A [Server] is the HTTP API over a Catalog:
//
//	PUT    /v1/policies/{id}                 new version (optimistic concurrency on expected_version)
//	GET    /v1/policies?tier=                policies in force, optionally only those that apply to a tier
//	GET    /v1/policies/{id}                 the version in force
//	GET    /v1/policies/{id}/history         every version, newest first
//	POST   /v1/policies/{id}/rollback        new version with an old version's document
//	DELETE /v1/policies/{id}?expected_version=N
//	POST   /v1/overrides                     per-subject override of one policy, with expiry
//	GET    /v1/overrides?subject=&policy=    overrides in force (expired ones with include_expired=true)
//	DELETE /v1/overrides/{id}
//	GET    /v1/keys/{key}/usage              bucket state, shares, daily counts of one subject
//	GET    /v1/audit?kind=&id=&author=&limit=  the audit log, newest first
//
// Every request needs a bearer token ([Tokens]); GETs need the read role,
// writes the admin role. A write is appended to the log first and applied to
// the Catalog only when the log acknowledged it, so a failed write changes
// nothing. Every error is an RFC 9457 application/problem+json document;
// bad input (malformed JSON, unknown fields, invalid parameters, oversized
// bodies, version conflicts) is a 4xx and changes nothing.
//
// # What it does not do
//
// It does not talk to Kafka or Redis itself: the log is the [Log] interface
// and key usage the [UsageReader] interface. It does not enforce
// overrides in gateways (package policysync carries them to the gateways;
// the limiter applies policies).
//
// # Invariants
//
//   - Versions of one (kind, id) start at 1 and a write creates exactly
//     current+1; a write whose expected_version is not the current version
//     is refused with 409 and changes nothing.
//   - A new policy version is in shadow mode unless the request sets
//     enforce; a rollback restores the old document exactly (mode included).
//   - Two regions that write the same version concurrently converge: every
//     Catalog keeps the record that sorts last by (unix_ms, author,
//     document), whatever order they arrive in.
//   - Every record applied is one audit entry (who, when, before, after).
package admin
