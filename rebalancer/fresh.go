package rebalancer

import (
	"errors"
	"fmt"
)

// ErrStartFresh: StartFresh was called on a Core that already collected an
// epoch or adopted records; nothing was changed.
var ErrStartFresh = errors.New("rebalancer: cannot start fresh")

// FirstStartEpochs is L_e, in epochs, for a Core of cfg (validated): a
// driver may call StartFresh before collecting epoch f only if the bus
// holds no report of this region of epochs f-FirstStartEpochs..f-1, and
// it has read every report of those epochs the bus holds. It is
// max(WarmupEpochs+1, 2*SilenceEpochs) (10 with the defaults): one epoch
// more than the warm-up of a restarted Core, whose predecessor's last
// report is of f-1 at the latest, and at least 2K, so that the records a
// Core whose publications failed may still have written (it can grow for
// K-1 epochs after its last report on the bus) expired (see the package
// doc, "First start").
func FirstStartEpochs(cfg Config) int64 {
	return max(cfg.WarmupEpochs+1, 2*cfg.SilenceEpochs)
}

// StartFresh makes a new Core skip its warm-up: its first collected epoch
// is reported, and its decisions write. The caller guarantees that no
// report of this region of the FirstStartEpochs epochs before the first
// collected one was published (see the package doc, "First start"). Call
// it once, before the first Collect; after it, a report of this region
// that this Core did not publish (another Started, an epoch before its
// first or after its last collected one) ends the skip: the Core then
// warms up as if it had started at the epoch after both that report and
// its own last one, forgetting every share it wrote (Stats.FreshRevoked).
//
// Errors: ErrStartFresh (already started or adopted); nothing is changed.
func (c *Core) StartFresh() error {
	if c.started || c.adopted {
		return fmt.Errorf("%w: the Core already started or adopted", ErrStartFresh)
	}
	// A new Core is in fallback (New), as after a warm-up: its first
	// report wants nothing (a region that finds it silent does not count
	// its want, package doc), and it leaves fallback by the usual rules.
	c.fresh = true
	return nil
}

// Fresh reports whether the Core skips its warm-up (StartFresh, not
// revoked since).
func (c *Core) Fresh() bool { return c.fresh }

// receiveOwn handles a report of this region taken from the bus: for a
// Core that skipped its warm-up, one it did not publish revokes the skip.
func (c *Core) receiveOwn(r *Report) {
	if !c.fresh {
		return
	}
	mine := c.started && r.Started == c.firstEpoch && r.Epoch >= c.firstEpoch && r.Epoch <= c.published
	if mine {
		return
	}
	c.fresh = false
	c.stats.FreshRevoked++
	if !c.started {
		// Not started: the usual warm-up from the first collected epoch,
		// at least the epoch after the report's.
		c.restart = r.Epoch + 1
		return
	}
	// As a Core started after both that report and this Core's own last
	// one: it publishes and writes nothing for WarmupEpochs, and then
	// claims the default for every key and writes each once.
	c.restart = max(c.published, r.Epoch) + 1
	for _, st := range c.all() {
		st.set(kfKnown|kfSynced, false)
	}
}
