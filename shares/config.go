package shares

import "fmt"

// Config holds the tuning of the share computation. Start from
// DefaultConfig and override fields; the simulator tunes them toward the
// global-accuracy goal. A Config is a value: safe to copy and to use from
// several goroutines.
type Config struct {
	// FloorPermille is the floor every live region's target gets, in
	// permille of the default share L/n, so a quiet region can admit its
	// first requests. 0..1000; default 15 (1.5% of the default share:
	// each idle region's floor is service lost while another region needs
	// the whole limit).
	FloorPermille int64
	// ReservePermille is the part of L that targets leave unallocated, in
	// permille of L. 0..500; default 0. (Claiming the reserve between
	// epochs is not implemented; a reserve only lowers the targets.)
	ReservePermille int64
	// SpreadPermille is the part of the leftover (L minus floors minus met
	// demand) split equally between live regions, in permille; the rest is
	// split in proportion to what each region already got. 0..1000; default
	// 250. Higher favours regions whose demand may rise; lower favours the
	// regions that use the limit now.
	SpreadPermille int64
	// DampingPermille is the part of the gap between a region's claim and
	// its target that it closes in one epoch, in permille. 1..1000; 0 means
	// the default, 1000 (no damping: smoothing of demand already damps).
	DampingPermille int64
	// HeadroomPermille is how far above its demand a region's share may
	// stay, in permille of its demand rate. It caps every live region's
	// target at max(Default(), demand*HeadroomPermille/1000), so leftover
	// beyond that stays unallocated, and it bounds what a region keeps at
	// collection (Config.Keep). 1000..100000; 0 means the default, 1250.
	HeadroomPermille int64
	// ProportionalPermille is, when the regions' demand above their floors
	// exceeds what there is to share (the key is over its limit), the part
	// of that amount split in proportion to each region's demand instead of
	// water-filled (max-min fair), in permille. 0..1000; default 300; 0 is
	// pure max-min. Max-min gives the smaller regions exactly their
	// smoothed demand, so their buckets run critically loaded and lose
	// tokens to the randomness of arrivals (a region of a few requests per
	// second leaves a second's tokens unused as often as it runs out), while
	// the ideal global limiter admits every region's requests in proportion
	// to their arrivals. Measured on the standard suite (README, "Share
	// algorithm"): 300 lowers the worst under-service of the skewed,
	// many-key and low-rate scenarios and costs the flash crowds a little.
	ProportionalPermille int64
}

// DefaultConfig returns the default tuning.
func DefaultConfig() Config {
	return Config{FloorPermille: 15, ReservePermille: 0, SpreadPermille: 250, DampingPermille: 1000, HeadroomPermille: 1250, ProportionalPermille: 300}
}

// Validate fills DampingPermille and HeadroomPermille when they are zero
// (the only fields whose zero value is unusable) and reports the first field out of range; the
// error wraps ErrConfig. Methods of Config call it on their copy.
func (c *Config) Validate() error {
	if c.DampingPermille == 0 {
		c.DampingPermille = 1000
	}
	if c.HeadroomPermille == 0 {
		c.HeadroomPermille = 1250
	}
	switch {
	case c.FloorPermille < 0 || c.FloorPermille > 1000:
		return fmt.Errorf("%w: FloorPermille %d not in 0..1000", ErrConfig, c.FloorPermille)
	case c.ReservePermille < 0 || c.ReservePermille > 500:
		return fmt.Errorf("%w: ReservePermille %d not in 0..500", ErrConfig, c.ReservePermille)
	case c.SpreadPermille < 0 || c.SpreadPermille > 1000:
		return fmt.Errorf("%w: SpreadPermille %d not in 0..1000", ErrConfig, c.SpreadPermille)
	case c.DampingPermille < 1 || c.DampingPermille > 1000:
		return fmt.Errorf("%w: DampingPermille %d not in 1..1000", ErrConfig, c.DampingPermille)
	case c.HeadroomPermille < 1000 || c.HeadroomPermille > 100_000:
		return fmt.Errorf("%w: HeadroomPermille %d not in 1000..100000", ErrConfig, c.HeadroomPermille)
	case c.ProportionalPermille < 0 || c.ProportionalPermille > 1000:
		return fmt.Errorf("%w: ProportionalPermille %d not in 0..1000", ErrConfig, c.ProportionalPermille)
	}
	return nil
}
