package rebalancer

// GiveRefusal says why Core.ReceiveGiveReason raised no share with a
// give. The zero value, GiveAccepted, is no refusal: some key was raised.
// The set is small and fixed (it labels the coordinator's
// quotient_coordinator_transfer_gives_refused_total{reason}); String
// gives each its label.
type GiveRefusal uint8

// Why a give was refused. Those up to RefusedEpoch refuse the whole give
// before any key is looked at, the first that applies in this order; the
// last three are a give whose every key was refused, named after the
// cause most of its keys had (a tie goes to the one declared first).
const (
	// GiveAccepted: some key's share was raised (not a refusal).
	GiveAccepted GiveRefusal = iota
	// RefusedInvalid: the give is malformed (the error wraps ErrTransfer).
	RefusedInvalid
	// RefusedOtherRegion: the give is addressed to another region (the
	// driver passes the Core only its own, so it never counts one).
	RefusedOtherRegion
	// RefusedDisabled: transfers are off (Config.Transfers).
	RefusedDisabled
	// RefusedWarmup: this region is in its warm-up after a start (it
	// publishes no report then), or has collected nothing since it
	// started.
	RefusedWarmup
	// RefusedNoReport: no report of this region was published for its
	// last collected epoch, so no give can be counted against one: it
	// started without a warm-up (it adopted its store's records) and has
	// collected no epoch yet.
	RefusedNoReport
	// RefusedFallback: this region's last decision was in fallback.
	RefusedFallback
	// RefusedDuplicate: this (From, ID) was accepted before.
	RefusedDuplicate
	// RefusedEpoch: the give is for another report period: its Transfer
	// is not this region's last collected epoch + 1 (one of the two
	// regions collected an epoch the other had not).
	RefusedEpoch
	// RefusedGivenHere: each key was given from this region since its
	// last report (no cascades).
	RefusedGivenHere
	// RefusedUnknownPolicy: each key's policy is unknown here (not, or
	// no longer, a global policy of this region's catalog).
	RefusedUnknownPolicy
	// RefusedNoRoom: nothing to raise: each key's share is at the limit,
	// or its amount is zero or would only have mixed the share (above the
	// default in one dimension, below it in the other); also a give with
	// no keys.
	RefusedNoRoom
)

var giveRefusalNames = [...]string{
	GiveAccepted:         "accepted",
	RefusedInvalid:       "invalid",
	RefusedOtherRegion:   "other_region",
	RefusedDisabled:      "disabled",
	RefusedWarmup:        "warmup",
	RefusedNoReport:      "no_report",
	RefusedFallback:      "fallback",
	RefusedDuplicate:     "duplicate",
	RefusedEpoch:         "epoch",
	RefusedGivenHere:     "given_here",
	RefusedUnknownPolicy: "unknown_policy",
	RefusedNoRoom:        "no_room",
}

// String returns the refusal's label ("accepted" for GiveAccepted,
// "unknown" for a value outside the set).
func (r GiveRefusal) String() string {
	if int(r) < len(giveRefusalNames) {
		return giveRefusalNames[r]
	}
	return "unknown"
}

// GiveRefusals returns every refusal, GiveAccepted excluded, in the order
// of their declaration (a new slice at each call).
func GiveRefusals() []GiveRefusal {
	out := make([]GiveRefusal, 0, len(giveRefusalNames)-1)
	for r := RefusedInvalid; int(r) < len(giveRefusalNames); r++ {
		out = append(out, r)
	}
	return out
}

// giveGate returns why this region refuses a whole give addressed to it
// (GiveAccepted: its keys are looked at); dup says (From, ID) was
// accepted before.
func (c *Core) giveGate(g *Give, dup bool) GiveRefusal {
	switch {
	case !c.cfg.Transfers:
		return RefusedDisabled
	case c.warm(c.published):
		return RefusedWarmup
	case !c.started || !c.ownReport:
		return RefusedNoReport
	case c.fallback:
		return RefusedFallback
	case dup:
		return RefusedDuplicate
	case g.Transfer != c.published+1:
		return RefusedEpoch
	}
	return GiveAccepted
}

// keyRefusals counts why the keys of one give were refused.
type keyRefusals struct{ givenHere, unknown, noRoom int }

// reason names a give whose every key was refused after the cause most
// of its keys had.
func (k keyRefusals) reason() GiveRefusal {
	switch {
	case k.givenHere > 0 && k.givenHere >= k.unknown && k.givenHere >= k.noRoom:
		return RefusedGivenHere
	case k.unknown > 0 && k.unknown >= k.noRoom:
		return RefusedUnknownPolicy
	}
	return RefusedNoRoom
}
