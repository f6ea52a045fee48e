// Package deployed runs a scenario (the format of package simulations) on
// the shipped binaries, in scaled real time: every region is its own host
// (a Linux network namespace with a veth on a bridge, internal/netlab)
// running its own redis-server, `quotient coordinator` and `quotient
// gateway`; the Kafka-protocol broker (the devkafka binary, so kfake is
// never linked into quotient) runs on a host of its own; paced HTTP
// clients send the scenario's requests through their region's gateway.
// It reports with the virtual-time engine's Recorder, so it writes the
// same summary.json, windows.csv, seconds.csv and plot, and the two modes
// compare window by window. `quotient simulate --deployed` is its command.
//
// # Scaling
//
// Time is compressed by TimeScale S (default 5), as in live mode: the
// run, epochs, windows, the schedule, faults and partitions take 1/S of
// their scenario seconds in real time, and every request rate and policy
// rate_per_sec is multiplied by S (bursts unchanged), so each epoch and
// window sees the same requests and tokens as the scenario and results
// are in scenario seconds. The compressed run is therefore the scenario
// itself, and its virtual-time counterpart is the same file (at the same
// rate scale: divide rates with live.ScaleRates to lighten a run; both
// modes then draw the same arrivals from the seed). The binaries' timing
// is scaled with it: --epoch epoch_s/S, --max-wait min(2 s, epoch/2)/S,
// --collect-delay min(1 s, max-wait/2)/S, --pressure-interval 1 s/S (the defaults of the unscaled
// epoch, divided), the gateways' --usage-flush 1 s/S. The one-way latency
// and jitter of the scenario's network are divided by S too.
//
// What does not scale: the gateways' store deadline (--timeout, a
// per-request bound; Config.StoreDeadline), the circuit breaker's 10 s
// error window and 5 s probe interval, the Kafka clients' timeouts and
// retry backoff, the policy reload interval and process start-up times
// (a coordinator restarted after a fault takes its real start-up time,
// which at S = 5 is five times longer in scenario seconds).
//
// # The network
//
// Regions reach the broker only through one TCP proxy per region
// (github.com/Shopify/toxiproxy/v2 used as a library, listening in the
// root namespace on the lab's bridge address): a region's connections to
// the broker's address are redirected to its proxy by destination NAT
// inside the region's namespace (netlab Host.Redirect), so the broker's
// metadata, which names its own address, does not bypass the proxy. Each
// proxy adds half the scenario's latency and jitter in each direction: a
// report crosses two proxies (producer to broker, broker to consumer), so
// region to region it takes the scenario's one-way latency ± jitter (the
// consumers' fetch wait comes on top, as in production). Partitions are
// nftables drops between the cut regions' hosts and every other host, the
// broker's included (netlab Block, Unblock when they end; overlapping
// partitions of one region end together at the first to_s).
//
// Loss and duplication: TCP neither loses nor duplicates, and Kafka's
// producers retry a failed request, so on the real path a message is lost
// when the broker acknowledges a write it does not keep, and duplicated
// when a write is stored twice (a retry after a lost acknowledgement,
// without idempotence). The broker does both: devkafka --drop-produce
// loss --duplicate-produce duplicate --fault-topic quotient.usage, one
// draw per produce request of a usage report (seeded by the scenario's
// seed). Differences from virtual time, where each delivery (message and
// receiving region) is lost or duplicated on its own: a lost report is
// lost for every region at once, and only the reports' topic is touched
// (the coordinators' other topics, policy log and daily-quota counts,
// are not). A duplicate is dropped by the coordinators by (region, epoch,
// sequence) in both modes.
//
// Clock skew: the hosts share the machine's clock, so a region's
// clock_skew_ms is passed to its coordinator and gateway as --clock-offset
// (a flag for tests only, which shifts every reading of the process's
// clock for the protocol: epoch numbers, the epoch loop's deadlines and
// fence claims, report and record timestamps, usage epochs), divided by
// the time scale like every other duration, so skew / epoch is the
// scenario's. That is what virtual time models: each region's clock is
// true time plus its skew, for its coordinator and its limiter alike. Not
// offset: the region's redis-server, whose clock refills the buckets (by
// differences, which an offset does not change) and expires share records
// at their absolute time. Run lists each region's offset in
// Stats.Applied, redis-server in Stats.NotApplied, and warns
// (Stats.Warnings) when the clocks are further apart than the epoch minus
// the collect delay and the max wait (the protocol assumes less; see the
// rebalancer package doc), which at the same skew / epoch holds or fails
// in virtual time alike.
//
// # Faults
//
// coordinator_down: the region's coordinator is killed with SIGKILL at
// from_s and a new one started at to_s, with the same flags: its state is
// lost and it warms up as a restarted production coordinator does (the
// rebalancer's warm-up epochs, reading its shares back from Redis).
// store_down: the region's redis-server is killed with SIGKILL at from_s
// and a new, empty one started at to_s on the same address; meanwhile the
// gateway's deadline, breaker and fallbacks act.
//
// # Where the clients run
//
// The paced clients run in this process, in the root namespace, and send
// to each gateway's address on the bridge. A partition cuts hosts from
// each other, never from the root namespace, so the clients never cross a
// cut link; they record every answer in the Recorder directly; and they
// are not the bottleneck (Stats.Late counts requests that started more
// than one scenario second late, Stats.MaxLateness the worst).
//
// Invariants: the same scenario and seed give the same requests as in
// virtual time (Report.Decisions counts the answered ones); everything Run
// starts (processes, namespaces, proxies, goroutines) is stopped before it
// returns. Not deterministic: decisions depend on real timing.
package deployed
