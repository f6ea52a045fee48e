// Package redistest starts real redis-server processes for tests: a
// standalone server ([StartServer]) or a three-primary Redis Cluster
// ([StartCluster]), each on free loopback ports (127.0.0.1), each in its own
// temporary directory, and stops them when the test that started them ends.
// With [WithTLS] a server (or every node) serves TLS only, with
// [WithPassword] it requires AUTH; its own probe and clients follow.
//
// It is for tests only: nothing outside _test.go files (and other test-helper
// packages) may import it.
//
// What it does not do: it never connects to a server it did not start (in
// particular never to the default port 6379), it never skips a test when
// redis-server is missing (the test fails and says what to install: run
// `make deps`), and it keeps no data on disk (no RDB snapshots, no AOF; a
// restarted server is empty, apart from a cluster node's nodes.conf).
//
// Invariants:
//   - Every server is owned by exactly one test (the testing.TB passed to the
//     Start function): it lives in that test's temporary directory and is
//     stopped by that test's Cleanup (SIGTERM, then SIGKILL after a bound).
//     There are no package-level servers, clocks or random sources.
//   - A server is reported ready only when the process this package started
//     answers on its address (the readiness probe compares the pid reported by
//     INFO server), so a port race with another process cannot hand a test
//     somebody else's server. A start that loses such a race retries on
//     another port.
//   - Every wait is bounded: start and cluster formation by the start timeout
//     (default 10 s, [WithStartTimeout]), a graceful stop by 5 s before
//     SIGKILL.
//
// The Start functions and Restart call t.Fatalf on failure, so they must be
// called from the test's goroutine. Other methods are safe for concurrent
// use.
package redistest
