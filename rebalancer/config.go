package rebalancer

import (
	"fmt"
	"slices"
	"time"

	"github.com/quotientlabs/quotient/shares"
)

// Config configures a Core. Start from DefaultConfig, set Region and
// Regions, and override what you need. Validate fills zero fields with
// their defaults.
type Config struct {
	// Region is this region's name. Required; must be in Regions.
	Region string
	// Regions are the names of every region sharing global limits, this one
	// included, 1..shares.MaxRegions, no duplicates. The Core orders them by
	// name; every region must be given the same set.
	Regions []string
	// Epoch is the rebalance interval, a whole number of milliseconds.
	// Epochs are aligned to multiples of it since the Unix epoch, so regions
	// agree on epoch numbers. Default 10 s.
	Epoch time.Duration
	// MaxWait is how long after an epoch ends the Core waits for laggards'
	// reports before deciding with an incomplete view (see Core.Due).
	// 0 < MaxWait <= Epoch/2. Default 2 s (but at most Epoch/2).
	MaxWait time.Duration
	// SilenceEpochs is K, in epochs: a region falls back to the safe share
	// after K epochs without hearing from some region (or without that
	// region hearing it), and the others assume it at exactly the safe
	// share after K+1 epochs without a report from it (K+RecordEpochs-1
	// under the partition rule's majority). >= 2; default 5
	// (with 3, a lossy bus made regions fall back whenever another missed
	// two of their reports in a row).
	SilenceEpochs int64
	// SmoothingPermille is the weight of the newest epoch in the smoothed
	// demand (an exponentially weighted moving average), in permille,
	// 1..1000. Default 500.
	SmoothingPermille int64
	// RiseSmoothingPermille is the weight of the newest epoch in the
	// smoothed demand when its demand rate is above the smoothed demand, in
	// permille, 1..1000. Demand counts rejected attempts, so a rise is
	// real demand, but following it at once (1000) makes shares of regions
	// below the water level noisier; default 500, as SmoothingPermille.
	// Whatever the weights, the smoothed demand is never above the newest
	// rate times Shares.HeadroomPermille, so a fall is followed at once.
	RiseSmoothingPermille int64
	// IdleTTLEpochs is the lifetime, in epochs, of a share record at or
	// below the default share; the Core refreshes such records every
	// IdleTTLEpochs/2 epochs. >= 2*(SilenceEpochs+2); default 360 (1 hour of
	// 10 s epochs). Records above the default live RecordEpochs epochs
	// from the start of the epoch of the decision that bounds them (see
	// package doc).
	IdleTTLEpochs int64
	// RecordEpochs is R, the lifetime in epochs of a share record above
	// the default: a record bounded by the decision of epoch d (written by
	// it, or between it and the next decision) expires at the start of
	// epoch d+R, and an unchanged one is rewritten every R-2 decisions.
	// 3..SilenceEpochs+1 (a record decided at d is written during d+1, and
	// the decision of d+1 must be able to refresh it; K+1 is the lifetime
	// the warm-up and first-start arguments were made for). 0 (DefaultConfig) means max(3,
	// SilenceEpochs-1): 4 with the default K.
	// The partition rule's timings follow from it, each with an epoch of
	// margin for clocks (package doc): a region is silent after K+R-1
	// epochs without a report of it, and a cut-off region rises to the
	// default K+R epochs after the last report it received. Shorter makes
	// a cut-off region rise sooner (the partition scenario: 7.8% worst
	// under-service with 3, 8.4% with 4, 12.4% with 5); longer keeps a
	// crashed coordinator's shares in force longer (coordinator-down:
	// 7.2%, 6.1%, 5.0%).
	RecordEpochs int64
	// WarmupEpochs is how many epochs a new Core stays silent (publishes no
	// report) and in fallback, so that share records a previous coordinator
	// of this region wrote above the default expire before this one claims
	// anything. >= SilenceEpochs+1. The partition rule's majority (package
	// doc) needs >= max(2*SilenceEpochs-1, SilenceEpochs+RecordEpochs-1),
	// so that a restarted region does not rise to the default before the
	// others count it silent; with less, every region that misses some
	// region's reports falls back, as before the heard matrix. Default
	// 2*SilenceEpochs-1 (9).
	WarmupEpochs int64
	// ShrinkAtCollect makes Collect give up, before the report is
	// published, the share the epoch's demand shows this region does not
	// need (shares.Config.Keep), and return those records in
	// Published.Updates. The report then claims the smaller share, so the
	// others can grow into it at their decision of the same epoch: one
	// epoch less lag on every shift of demand. Only a driver that writes
	// Published.Updates before it publishes the report may set it (Driver
	// and the simulator's do); with a driver that ignores them the enforced
	// sum could exceed L. DefaultConfig sets it; the zero Config does not.
	ShrinkAtCollect bool
	// Transfers turns on asks and gives between decisions (see the
	// package doc, "Transfers between decisions"): with it off, Pressure
	// returns nil, ReceiveAsk gives nothing and ReceiveGive refuses every
	// gift. Only a driver that writes ReceiveAsk's updates before it
	// publishes the Give, and ReceiveGive's before its next report, may
	// set it. DefaultConfig sets it; the zero Config does not.
	Transfers bool
	// AskInterval is the time after which a lost ask is asked again
	// (two asks for the same key are at least half of it apart: see
	// Core.Pressure), and the span a giver's demand rate is taken to be
	// measured over: on a first ask it keeps three requests per
	// AskInterval above it (giveNoise). 0 < AskInterval <= Epoch; default 1 s
	// (the gateways' usage flush interval; region sets it from its
	// PressureInterval).
	AskInterval time.Duration
	// AskThresholdPermille is the smallest need worth an ask, and the
	// smallest amount worth a give, in permille of the key's limit L
	// (rate; burst in proportion). 1..1000; default 20 (2% of L).
	AskThresholdPermille int64
	// Deltas makes the Core publish delta reports (Report.Base > 0): a
	// key whose line equals that of the Core's last full report (within
	// DeltaDemandPermille on demand) is left out. Deltas are made against
	// the last full report only (never a chain), and only while every
	// region this Core hears says Report.AcceptsDelta (and none shows it
	// lacks the base). DefaultConfig sets it; the zero Config does not.
	// Receiving deltas needs no setting. Cost: the sender keeps its base
	// (about 65 B per key), and a receiver keeps each region's last full
	// report besides its latest one (about 50 B per key and region;
	// estimates from the types' sizes, not measured). Measured
	// (BenchmarkDeltaSteady100k, 100k steady keys, three regions): 7.5 ->
	// 1.25 lz4 bytes per key and epoch on Kafka, Receive 60 -> 14 ms per
	// epoch; Decide unchanged (22-24 ms).
	Deltas bool
	// FullEvery is how often a report is full while Deltas is on: every
	// FullEvery-th report is full, and so is the first after the Core
	// starts, after an epoch it published no report for, and after a
	// region that does not accept deltas was heard. >= 1 (1: every report
	// full); default 6 (one full report per minute of 10 s epochs: a
	// receiver that lost a full report misses at most 5 epochs of that
	// sender, fewer than a silence bound of K+1 = 6).
	FullEvery int
	// DeltaDemandPermille is the tolerance, in permille of the base
	// report's value, within which a delta leaves a key out although its
	// demand fields (Demand, Admitted, SmoothedDemandMilli) changed. Its
	// claims (Share, Want) must equal the base's exactly whatever the
	// tolerance. 0..1000; 0 is exact (a delta then expands to exactly the
	// full report); default 4. Set DeltaExact for 0 (a zero field is
	// filled with the default).
	DeltaDemandPermille int64
	// DeltaExact makes DeltaDemandPermille 0 (exact deltas).
	DeltaExact bool
	// Shares tunes the share computation; see package shares.
	Shares shares.Config
}

// DefaultCollectDelay is the collect delay a Driver uses when
// DriverConfig.CollectDelay is zero: the smaller of 1 s (the gateways'
// default usage flush interval, so their last flush of the epoch lands
// first) and maxWait/2 (so the report still goes out well within the wait
// for laggards). The simulator uses it too, so virtual time collects when
// production does.
func DefaultCollectDelay(maxWait time.Duration) time.Duration {
	return min(time.Second, maxWait/2)
}

// DefaultConfig returns the defaults; Region and Regions are empty.
func DefaultConfig() Config {
	return Config{
		Epoch:                 10 * time.Second,
		MaxWait:               2 * time.Second,
		SilenceEpochs:         5,
		SmoothingPermille:     500,
		RiseSmoothingPermille: 500,
		IdleTTLEpochs:         360,
		WarmupEpochs:          9,
		ShrinkAtCollect:       true,
		Transfers:             true,
		AskInterval:           time.Second,
		AskThresholdPermille:  20,
		Deltas:                true,
		FullEvery:             6,
		DeltaDemandPermille:   4,
		Shares:                shares.DefaultConfig(),
	}
}

// Validate fills zero fields with their defaults and reports the first
// field out of range; the error wraps ErrConfig and names the field.
func (c *Config) Validate() error {
	def := DefaultConfig()
	if c.Epoch == 0 {
		c.Epoch = def.Epoch
	}
	if c.MaxWait == 0 {
		c.MaxWait = min(def.MaxWait, c.Epoch/2)
	}
	if c.SilenceEpochs == 0 {
		c.SilenceEpochs = def.SilenceEpochs
	}
	if c.SmoothingPermille == 0 {
		c.SmoothingPermille = def.SmoothingPermille
	}
	if c.RiseSmoothingPermille == 0 {
		c.RiseSmoothingPermille = def.RiseSmoothingPermille
	}
	if c.IdleTTLEpochs == 0 {
		c.IdleTTLEpochs = max(def.IdleTTLEpochs, 2*(c.SilenceEpochs+2))
	}
	if c.RecordEpochs == 0 {
		c.RecordEpochs = max(3, c.SilenceEpochs-1)
	}
	if c.WarmupEpochs == 0 {
		c.WarmupEpochs = max(c.SilenceEpochs+1, 2*c.SilenceEpochs-1)
	}
	if c.AskInterval == 0 {
		c.AskInterval = min(def.AskInterval, c.Epoch)
	}
	if c.AskThresholdPermille == 0 {
		c.AskThresholdPermille = def.AskThresholdPermille
	}
	if c.FullEvery == 0 {
		c.FullEvery = def.FullEvery
	}
	if c.DeltaExact {
		c.DeltaDemandPermille = 0
	} else if c.DeltaDemandPermille == 0 {
		c.DeltaDemandPermille = def.DeltaDemandPermille
	}
	switch {
	case c.Region == "":
		return fmt.Errorf("%w: Region is empty", ErrConfig)
	case len(c.Regions) < 1 || len(c.Regions) > shares.MaxRegions:
		return fmt.Errorf("%w: Regions has %d names, want 1..%d", ErrConfig, len(c.Regions), shares.MaxRegions)
	case !slices.Contains(c.Regions, c.Region):
		return fmt.Errorf("%w: Regions %v does not contain Region %q", ErrConfig, c.Regions, c.Region)
	case c.Epoch < time.Millisecond || c.Epoch%time.Millisecond != 0:
		return fmt.Errorf("%w: Epoch %v is not a positive whole number of milliseconds", ErrConfig, c.Epoch)
	case c.MaxWait < 0 || c.MaxWait > c.Epoch/2:
		return fmt.Errorf("%w: MaxWait %v not in (0, Epoch/2 = %v]", ErrConfig, c.MaxWait, c.Epoch/2)
	case c.SilenceEpochs < 2:
		return fmt.Errorf("%w: SilenceEpochs %d < 2", ErrConfig, c.SilenceEpochs)
	case c.RecordEpochs < 3 || c.RecordEpochs > c.SilenceEpochs+1:
		return fmt.Errorf("%w: RecordEpochs %d not in 3..SilenceEpochs+1 = %d", ErrConfig, c.RecordEpochs, c.SilenceEpochs+1)
	case c.SmoothingPermille < 1 || c.SmoothingPermille > 1000:
		return fmt.Errorf("%w: SmoothingPermille %d not in 1..1000", ErrConfig, c.SmoothingPermille)
	case c.RiseSmoothingPermille < 1 || c.RiseSmoothingPermille > 1000:
		return fmt.Errorf("%w: RiseSmoothingPermille %d not in 1..1000", ErrConfig, c.RiseSmoothingPermille)
	case c.IdleTTLEpochs < 2*(c.SilenceEpochs+2):
		return fmt.Errorf("%w: IdleTTLEpochs %d < 2*(SilenceEpochs+2) = %d", ErrConfig, c.IdleTTLEpochs, 2*(c.SilenceEpochs+2))
	case c.WarmupEpochs < c.SilenceEpochs+1:
		return fmt.Errorf("%w: WarmupEpochs %d < SilenceEpochs+1 = %d", ErrConfig, c.WarmupEpochs, c.SilenceEpochs+1)
	case c.AskInterval < 0 || c.AskInterval > c.Epoch:
		return fmt.Errorf("%w: AskInterval %v not in (0, Epoch = %v]", ErrConfig, c.AskInterval, c.Epoch)
	case c.AskThresholdPermille < 1 || c.AskThresholdPermille > 1000:
		return fmt.Errorf("%w: AskThresholdPermille %d not in 1..1000", ErrConfig, c.AskThresholdPermille)
	case c.FullEvery < 1:
		return fmt.Errorf("%w: FullEvery %d < 1", ErrConfig, c.FullEvery)
	case c.DeltaDemandPermille < 0 || c.DeltaDemandPermille > 1000:
		return fmt.Errorf("%w: DeltaDemandPermille %d not in 0..1000", ErrConfig, c.DeltaDemandPermille)
	}
	seen := make(map[string]bool, len(c.Regions))
	for _, r := range c.Regions {
		if r == "" {
			return fmt.Errorf("%w: Regions contains an empty name", ErrConfig)
		}
		if seen[r] {
			return fmt.Errorf("%w: Regions contains %q twice", ErrConfig, r)
		}
		seen[r] = true
	}
	if err := c.Shares.Validate(); err != nil {
		return fmt.Errorf("%w: Shares: %w", ErrConfig, err)
	}
	return nil
}
