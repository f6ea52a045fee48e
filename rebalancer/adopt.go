package rebalancer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/quotientlabs/quotient/shares"
)

// ErrAdopt: Adopt was called on a Core that already collected an epoch or
// adopted records; nothing was changed.
var ErrAdopt = errors.New("rebalancer: cannot adopt records")

// ShareRecord is one share record read from this region's store.
type ShareRecord struct {
	Key
	// Share is the share the record holds (what the gateways enforce).
	Share shares.Share
	// ExpireAt is when the record expires; zero when it has no expiry.
	ExpireAt time.Time
}

// RecordSource reads every share record of this region's store (the
// driver's warm start; rebalancer/redisio.Records in production). The Core
// never calls it.
type RecordSource interface {
	// Records returns every share record of this region. The caller owns
	// the slice. An error means the records are not all known; the
	// driver then starts cold (warm-up).
	Records(ctx context.Context) ([]ShareRecord, error)
}

// Adopt makes a new Core start from the share records this region's store
// holds, instead of warming up: each record's share becomes the key's claim
// and every key without a record is at the default. The caller guarantees
// that records is every record of the region and that nothing else writes
// records from the moment they were read (see the package doc, "Warm
// start"). now is when they were read.
//
// Records of unknown or invalid policies are skipped (counted as by
// Collect). A record below the default that expires within two epochs of
// now is refreshed: its update is returned and must be written before the
// first report is published (the report claims it). Call it once, before
// the first Collect.
//
// Errors: ErrAdopt (already started or adopted), or a record with a
// negative share or empty PolicyID, or a key twice; nothing is changed.
func (c *Core) Adopt(now time.Time, records []ShareRecord) ([]Update, error) {
	if c.started || c.adopted {
		return nil, fmt.Errorf("%w: the Core already started or adopted", ErrAdopt)
	}
	seen := make(map[Key]bool, len(records))
	for i, r := range records {
		switch {
		case r.PolicyID == "":
			return nil, fmt.Errorf("%w: record %d: PolicyID is empty", ErrAdopt, i)
		case r.Share.RateMilli < 0 || r.Share.BurstMilli < 0:
			return nil, fmt.Errorf("%w: record %d (%s/%s): negative Share", ErrAdopt, i, r.PolicyID, r.Subject)
		case seen[r.Key]:
			return nil, fmt.Errorf("%w: record %d: key %s/%s twice", ErrAdopt, i, r.PolicyID, r.Subject)
		}
		seen[r.Key] = true
	}
	c.lcOn = false
	defer func() { c.lcOn = false }()
	c.adopted = true
	e := EpochOf(now, c.cfg.Epoch)
	var ups []Update
	for _, r := range records {
		lim, ok := c.keyLimit(r.Key, now)
		if !ok {
			continue
		}
		st := c.st.at(c.hold(r.Key, e))
		short := lim.AboveDefault(r.Share)
		st.share, st.claim = r.Share, r.Share
		st.set(kfKnown|kfSynced|kfRecord, true)
		st.set(kfShort, short)
		// writtenAt as the record's expiry says (record's rule), so it is
		// refreshed when a record written then would be; no expiry: at once.
		switch {
		case r.ExpireAt.IsZero():
			st.written = writtenLongAgo
		case short:
			c.setWrittenAt(st, EpochOf(r.ExpireAt, c.cfg.Epoch)-c.recordEpochs())
		default:
			c.setWrittenAt(st, EpochOf(r.ExpireAt, c.cfg.Epoch)-c.cfg.IdleTTLEpochs)
		}
		if r.Share == lim.Default() {
			// A record at the default is the default: delete it at the
			// first decision (equal enforcement either way).
			st.set(kfSynced, false)
		}
		// A record below the default must not expire while claimed (expiry
		// raises it to the default); a record above it may (it falls).
		if !short && r.Share != lim.Default() && (r.ExpireAt.IsZero() || r.ExpireAt.Before(EpochStart(e+2, c.cfg.Epoch))) {
			ups = append(ups, c.record(r.Key, st, lim, r.Share, e-1))
		}
	}
	c.stats.Updates += int64(len(ups))
	return ups, nil
}

// Adopted reports whether the Core started from adopted records.
func (c *Core) Adopted() bool { return c.adopted }
