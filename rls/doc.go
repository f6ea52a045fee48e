// Package rls serves Envoy's rate limit service API
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) with the
// Quotient limiter, configured by envoyproxy/ratelimit's YAML files.
//
// Configuration ([Parse], [LoadDir], [Watcher]): the files of
// envoyproxy/ratelimit load unchanged — domain, nested descriptors with key
// and optional value (a value ending in '*' matches every value with that
// prefix), rate_limit with unit (second, minute, hour, day, week, month,
// year) and requests_per_unit, unlimited, name, replaces, shadow_mode,
// detailed_metric and share_threshold. Every other field is an error that
// names the file, the path and the field. Matching is envoyproxy's: for each
// entry of a request descriptor, an exact key and value first, then the
// first wildcard value of that key in file order, then the key alone; the
// descriptor gets the rule found at its last entry, and none when the
// configuration is shallower or deeper than the descriptor.
//
// Quotient policies: a rule may name a Quotient policy document instead of
// a unit and a limit (rate_limit: {policy: ID}, Quotient's one extension
// of the format); the descriptor tree matches as above and the policy of
// the limiter's own set with that id decides, with its algorithm, cost
// (the entry of the descriptor's "method" and "path" entries), class,
// on_store_failure, mode, scope and overrides. Invariant: every policy the
// configuration in force names is in the policy set in force
// ([Server.SetConfig] and [Server.SetPolicies] refuse what would break it).
//
// Translation: every rule with a limit becomes a Quotient fixed_window
// policy of requests_per_unit per unit, windows aligned to the Unix epoch
// as in envoyproxy/ratelimit (a month is 30 days, a year 365 days, a week
// starts on Thursday 00:00 UTC). The subject of a descriptor is
// [limiter.SubjectDescriptor] with the domain and the descriptor's entries
// (the wildcard pattern instead of the value under share_threshold), so
// every distinct descriptor counts on its own, like envoyproxy's cache
// keys, and all keys of one descriptor share one Redis Cluster slot.
//
// Decisions ([Server]): all descriptors of one request are decided in one
// call of [limiter.Limiter.CheckSubjectsInto], with the limiter's deadline,
// breaker, fallback and deny cache. Invariants: a request that any enforced
// limit rejects consumes nothing from any descriptor (envoyproxy/ratelimit
// counts every descriptor of an over-limit request, the rejected hits
// included); a malformed request consumes nothing and gets InvalidArgument;
// no call waits on Redis longer than the limiter's deadline.
//
// Differences from envoyproxy/ratelimit, on purpose: hits that are
// rejected are not counted, so a caller that keeps calling over its limit
// does not push its own window further over; when the descriptors of one
// request carry different hits_addend values they are decided in groups of
// equal cost, in request order, stopping at the first group that rejects
// (earlier groups keep what they consumed).
//
// The package does no I/O of its own but reading configuration files;
// Redis is behind the limiter.
package rls
