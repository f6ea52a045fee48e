// Package simulations replays traffic models through Quotient's own code in
// virtual time and measures how far the admitted traffic is from an ideal
// global limiter. `quotient simulate` is its command; scenarios/ holds the
// standard suite (the contract is ../shared/scenarios/FORMAT.md: input
// fields, the ideal, the error metric, the outputs).
//
// # What runs
//
// Each region has the production limiter.Limiter over its own
// limiter.MemoryStore (Config.Regions = n, so a key without a share record
// gets the default L/n), called with rawcheck.CheckSubjectsAt at the region's own
// clock, and one Coordinator. The default Coordinator drives the production
// rebalancer.Core (and through it package shares) exactly as a coordinator
// driver does; its updates become share records via MemoryStore.SetShare.
// When the scenario has global fixed_window policies it is combined
// (Combine) with DailyQuotaCoordinator, which drives the production
// dailyquota.Driver (Pass every second, Deliver per received count): its
// counts travel on the engine's bus and are merged with
// MemoryStore.MergeWindowCount, its remainder-split caps set with
// MemoryStore.SetWindowCap, and it finds the active keys in the engine's
// records of what each region served (RegionInfo.Served).
// StaticCoordinator (fixed L/n shares, no replication: each region spends
// a global fixed window on its own counts) is the baseline. Scenario
// policies are parsed by limiter.ParsePolicy: they are product policy
// documents.
//
// A region with Envoys (scenario field envoys) serves its traffic through
// the RLQS tier instead (envoys.go): N simulated Envoys with local token
// buckets and the production rls/quota.Server, driven through quota.Conn
// with the region's clock; the server's usage flushes become the region's
// usage and it reads the coordinator's share records.
//
// Nothing here re-implements the limiter, the share computation, the
// RLQS split or the daily-quota replication. The store_down fallback runs
// the limiter's own fallback (rawcheck.CheckSubjectsFallbackAt).
//
// # The engine
//
// A discrete-event simulation over a binary heap ordered by (time, kind,
// sequence): a total order, so the same scenario and seed give
// byte-identical outputs (every map is iterated in sorted order or not at
// all). Events: request arrivals (one stream per named key and region, one
// per generated group whose requests draw a key by Zipf popularity and a
// region by region_mix), epoch boundaries of each region's clock (true time
// plus clock_skew_ms; epochs are multiples of epoch_s since the Unix
// epoch), coordinator wake-ups (the bounded wait for late reports), bus
// deliveries, and the end of each simulated second (shares are sampled for
// seconds.csv, progress is reported, cancellation is checked). Time is
// int64 nanoseconds since t=0 (DefaultStart, a UTC midnight); the limiter
// sees milliseconds.
//
// Every random choice has its own *rand.Rand (PCG) seeded from the
// scenario seed and the purpose's name: arrival times per stream, key and
// region draws per group, the bus. Adding a stream never shifts another's
// draws.
//
// Poisson arrivals restart at every step of a rate schedule (memoryless);
// uniform arrivals are evenly spaced within each step. The bus delivers
// each published message to every other region: lost with probability
// loss, duplicated with probability duplicate, delayed by latency +-
// jitter (uniform, never negative), dropped when a partition separates the
// two regions at sending or at delivery. One latency is what a report
// costs on the real path: rebalancer/kafkabus delivers it one round trip
// to the broker after Publish (half on the produce, half on the fetch the
// consumer keeps open at the broker; TestReportDeliveryRoundTrips), which
// deployed mode's proxies (half the latency on each region's link) make
// the scenario's one-way latency. Not modelled: up to one more round trip
// when a consumer's fetch was just answered, and kafka-go's limit of a 1 s
// round trip to the broker. While a region's coordinator is
// down it neither ticks nor receives: deliveries wait (as in Kafka) and are
// handed over before its first boundary after the outage; the usage of
// epochs that end meanwhile is lost. While a region's store is down its
// requests go to an in-process fallback limiter per the policy's
// on_store_failure (open: twice the region's default share; local: the
// default share, one gateway instance per region; closed: rejected).
//
// Gateways are modelled as one per region, counting demand (every attempt)
// and admitted cost per policy and subject; the coordinator receives the
// epoch's counts at the boundary, and the rebalancer's adapter collects them
// with production's timing: rebalancer.DefaultCollectDelay after the
// boundary (1 s with the default max-wait), by which time the gateways'
// last flush of the epoch (every GatewayFlushInterval, 1 s) has landed, so
// the counts are the whole epoch's. Coordinators start HeadStartEpochs
// epochs before the traffic unless Options.ColdStart is set (then the
// fleet's cold start is in the scored windows).
//
// Faults are modelled as deployed systems meet them. coordinator_down is
// a crash (SIGKILL) and a restart: the engine builds a new coordinator when
// the outage ends, which has lost every state (a rebalancer warms up, as a
// restarted process whose outage spans more than an epoch does) and first
// re-reads the messages a restarted consumer would (Replayer: the report
// consumer's lookback, the whole compacted daily-quota topic). store_down
// fails the gateways' calls (the fallback decides) and the coordinator's
// share writes (RegionInfo.StoreDown): the rebalancer adapter holds and
// retries them and publishes no report while any is unwritten, as the
// driver does.
//
// # Measurement
//
// A Recorder counts demand and admitted cost per tracked (key, policy),
// region and second (per second and region only for named keys; per
// evaluation window for all), computes the ideal (one token bucket full at
// t=0 fed the global demand second by second, or a fixed window aligned to
// the Unix epoch) and the error per window, (admitted - ideal) / allowance.
// A Report writes <name>.summary.json, .windows.csv, .seconds.csv and .svg
// (gonum.org/v1/plot). The live mode (package simulations/live) feeds the
// same Recorder from real decisions against redis-servers, a Kafka broker
// and the region coordinators, and reuses every writer.
//
// Invariants: the same scenario, seed and options give the same outputs,
// byte for byte, except summary.json's wall_s; demand and admitted are
// whole cost units, the ideal has at most three decimals. Not safe for
// concurrent use within one run; separate runs share nothing.
package simulations
