package rebalancer

import (
	"errors"
	"time"

	"github.com/quotientlabs/quotient/shares"
)

// Transfers between decisions (asks and gives): a region whose demand for
// a key outruns its share asks the others for the difference (Ask); a
// region with spare share lowers its share and gives the amount (Give);
// the asker raises its share by what it accepts. They travel on their own
// topic beside the reports; see the package doc ("Transfers between
// decisions") for the rules and why the enforced sum stays within L.

// ErrTransfer: an Ask or a Give is malformed (nil, unknown region, a key
// twice, a negative amount); it was not applied.
var ErrTransfer = errors.New("rebalancer: invalid transfer")

// Pressure is this region's recent demand for one key: what its gateways
// attempted per second (allowed or not), in milli cost units, over the
// last pressure window (about a second, see DriverConfig's pressure
// interval), as their flushed usage shows it. A driver passes the keys
// whose demand outran what was admitted (the gateways' pressure marks).
type Pressure struct {
	Key
	DemandMilli int64 // milli cost units per second, >= 0
}

// AskKey is one key of an Ask: the asker's demand for Key outruns its
// share by Need (rate and burst; burst = rate*B/L).
type AskKey struct {
	Key
	Need shares.Share
}

// Ask is a region's request for share. It is sent to every region; the
// Core keeps no reference to it.
type Ask struct {
	Region string // the asker
	Epoch  int64  // the asker's last collected (published) report epoch
	Keys   []AskKey
}

// GiveKey is one key of a Give: the giver no longer enforces Amount of
// its share of Key; the receiver may.
type GiveKey struct {
	Key
	Amount shares.Share
}

// Give moves share from region From to region To. The giver lowered its
// share by every Amount, and wrote that, before sending it. The amounts
// count in the giver's claims of epochs < Transfer and in the receiver's
// claims of epochs >= Transfer; a receiver whose last report is not of
// epoch Transfer-1 refuses the gift (it is lost until the next decision:
// safe). The Core keeps no reference to it.
type Give struct {
	From, To string
	// ID is strictly increasing per giver and, in practice, unique across
	// its restarts (from the clock, in microseconds): receivers refuse a
	// (From, ID) they accepted before (a duplicate on the bus).
	ID int64
	// Transfer (T) is the giver's last collected report epoch + 1.
	Transfer int64
	Keys     []GiveKey
}

// Pressure is called by the driver every pressure interval (about a
// second) with this region's recent demand for the keys under pressure.
// It returns the Ask to publish, or nil when no key needs more share: a
// key is asked for when demand*HeadroomPermille/1000 exceeds its share by
// more than Config.AskThresholdPermille of L, the region is neither in
// fallback nor in warm-up, the key was not asked for within
// Config.AskInterval, and this region gave none of it since its last
// report. Entries with an unknown policy or a negative demand are
// skipped. Never returns updates: asking changes no share.
func (c *Core) Pressure(now time.Time, pressure []Pressure) *Ask {
	return nil
}

// ReceiveAsk answers another region's Ask, with own this region's recent
// demand for the asked keys (as for Pressure; a key absent from own has
// demand 0). For each key this region has spare share for (its share
// minus max(own demand*headroom, the floor)), not accepted since its last
// report, it lowers its share by min(spare, Need) and returns the Updates
// that write the lowered shares, and the Give to publish; both nil when
// it gives nothing (in fallback, in warm-up, before its first report, or
// no spare). The driver MUST write the updates before publishing the
// Give, and drop the Give when the write fails (the Core has already
// lowered its shares: the next report claims the lowered share, an upper
// bound of what is enforced). Errors wrap ErrTransfer (malformed ask, or
// an ask from an unknown region); nothing changed then. An ask of this
// region's own is ignored (nil, nil, nil).
func (c *Core) ReceiveAsk(now time.Time, ask *Ask, own []Pressure) ([]Update, *Give, error) {
	return nil, nil, nil
}

// ReceiveGive applies a Give addressed to this region: it raises this
// region's share of each key by the amount (minus whatever part would put
// the share above the default in one dimension and below it in the
// other) and returns the Updates to write. It refuses the whole gift
// (nil, nil) when To is not this region, when it is in fallback or
// warm-up, when (From, ID) was accepted before, or when this region's
// last collected report is not of epoch Transfer-1; a refused gift is
// lost (the giver's next report no longer claims it, so the next decision
// hands it out again). Per key it also refuses a key given since its last
// report (no cascades). If the write fails, the driver must not publish
// the next report until the updates are written, as for a decision's.
// Errors wrap ErrTransfer (malformed give); nothing changed then.
func (c *Core) ReceiveGive(now time.Time, g *Give) ([]Update, error) {
	return nil, nil
}
