// Package live runs a scenario (the format of package simulations) in
// scaled real time against the real parts: one standalone redis-server per
// region, a Kafka-protocol broker, one real coordinator per region
// (package region: rebalancer driver, Redis usage source and share sink,
// kafkabus) and gateways calling the real limiter (limiter.Limiter.Check
// over a RedisStore, with its deny cache, store deadline and a
// UsageFlusher writing usage to the region's Redis every flush interval).
// It reports with the virtual-time engine's Recorder, so it writes the
// same summary.json, windows.csv, seconds.csv and plot, and the two modes
// compare window by window. `quotient simulate --live` is its command.
//
// # Scaling
//
// Time: TimeScale scenario seconds pass per real second (default 20).
// The run, epochs, windows, the gateways' flush interval (1 s) and the
// coordinators' collect delay (1 s) are divided by it; policies are handed
// to the limiter and the coordinators with rate_per_sec multiplied by it
// and the same burst, so a bucket gains the same tokens per scenario
// second and each epoch sees the same requests as in the scenario. The
// coordinators' MaxWait is half a scaled epoch (the region default),
// which gives the loopback broker room; a decision is still taken as soon
// as every report is in. The coordinators start HeadStartEpochs epochs
// before t=0, as in virtual time. epoch_s x 1000 / TimeScale must be whole
// milliseconds.
//
// Rates: ScaleRates divides every request rate, policy rate and burst by
// a factor (`--rate-scale`), giving a lighter scenario with the same
// shape; compare it with its own virtual-time run (both modes draw the
// same arrivals from the same seed: simulations.NewSchedule replays the
// engine's generators).
//
// # What is measured
//
// Requests are recorded at their scheduled scenario second; their
// decisions are made when a gateway worker takes them (Stats.MaxLateness
// says how late). Shares are sampled from each region's Redis at the end
// of every scenario second. Stats.Faithful says whether the machine kept
// the schedule: a loaded machine (or the race detector) delays reports
// past MaxWait and the coordinators then hold for an epoch, which measures
// the machine rather than Quotient.
//
// # What it does not do
//
// Live mode v1 rejects (Check, a *simulations.ScenarioError naming the
// field) network loss, duplication and partitions, clock_skew_ms, faults
// (coordinator_down, store_down), fixed-window policies and ip subjects.
// latency_ms and jitter_ms are accepted and not injected: reports take
// the broker's own loopback latency. It does not start Redis or Kafka:
// the caller gives their addresses (tests start redis-servers with
// internal/redistest and kfake in-process; from the command line use
// redis-server and `go run ./cmd/devkafka`). It deletes nothing: every run
// uses fresh subjects ("<RunID>/<key>") and topics ("quotient.usage.<RunID>"),
// so earlier runs' buckets and share records do not interfere, but two
// runs must not share a Redis at the same time (each region's coordinator
// collects all usage flushed to its server).
//
// Invariants: the same scenario and seed give the same requests as in
// virtual time (Report.Decisions equal); everything Run starts
// (goroutines, clients, coordinators) is stopped before it returns. Not
// deterministic: decisions depend on real timing.
package live
