// Package e2e tests Quotient as users deploy it: the binaries built from
// cmd/ (quotient coordinator, quotient gateway, quotient admin, and
// devkafka as the Kafka-protocol broker), started as processes with the
// flags an operator would pass, each region with its own redis-server, a
// plain upstream, and paced HTTP clients sending through the gateways.
//
// Nothing here is linked into a product binary; the package has only
// tests. It needs redis-server on the PATH (make deps installs it) and the
// Go toolchain that runs the test (to build the binaries once per run).
//
// What it asserts, and why it is the proof of a global limit: the admitted
// total of every key, per 60 s window, is within the seed design's 15 % of
// an ideal global limiter fed the same demand (the ideal of
// ../shared/scenarios/FORMAT.md); the sum of the shares the three regions
// enforce, read from their three Redis servers every 100 ms, never exceeds
// the global rate or burst; a global daily window never exceeds its limit
// by more than its documented overshoot bound (the other regions' traffic
// during one replication lag).
//
// The resilience tests run each region as its own host (internal/netlab:
// a network namespace with its redis-server, coordinator and gateway, the
// broker on a host of its own) and inject one fault each: a region cut
// off and the broker cut off with nftables (QUOTIENT_E2E_FAULT_FOR long:
// 40 s by default, 10 min under make e2e-faults), a region's redis-server
// killed with SIGKILL and restarted empty, a coordinator leader killed.
// They need root, ip and nft and skip, naming what is missing, without.
//
// Every test runs in parallel with the others, four at a time (make e2e
// passes -parallel 4) and the longest first (order_test.go): each is a deployment of its own, on free loopback
// ports or in a lab of its own, of mostly idle processes at tens of
// requests per second.
package e2e
