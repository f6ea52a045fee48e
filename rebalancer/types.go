package rebalancer

import (
	"context"
	"errors"
	"time"

	"github.com/quotientlabs/quotient/shares"
)

// Errors that callers branch on; returned errors wrap them and say what was
// wrong.
var (
	// ErrConfig: a Config field is out of range.
	ErrConfig = errors.New("rebalancer: invalid config")
	// ErrUsage: a Usage entry given to Collect is invalid; nothing was
	// changed.
	ErrUsage = errors.New("rebalancer: invalid usage")
	// ErrReport: a received Report is malformed; it was not applied.
	ErrReport = errors.New("rebalancer: invalid report")
	// ErrEpochNotOver: Collect was called again before the next epoch
	// ended (or with time going backwards); nothing was changed.
	ErrEpochNotOver = errors.New("rebalancer: epoch not over")
	// ErrNothingPending: Decide was called with no published epoch waiting
	// for a decision.
	ErrNothingPending = errors.New("rebalancer: no epoch pending")
	// ErrUsageIncomplete is wrapped by a UsageSource's error when the usage
	// it returns with it is a lower bound: some gateway dropped usage of
	// the epoch (its UsageMaxKeys bound), so a key may be missing although
	// it was used, and a total may be short. The driver collects such an
	// epoch with Core.CollectIncomplete.
	ErrUsageIncomplete = errors.New("rebalancer: usage incomplete")
)

// Key identifies one global limit of one subject.
type Key struct {
	PolicyID string // ID of the global policy
	Subject  string // the limiter's encoded subject
}

// Usage is what the gateways of this region flushed for one key and epoch.
// Several entries for one key are added up.
type Usage struct {
	Key
	Demand   int64 // cost units attempted, allowed or not, >= 0
	Admitted int64 // cost units admitted, 0..Demand
}

// KeyReport is one key's line in a Report. A region omits keys it is idle
// on and holds at the default share: a missing key means demand 0, share
// Default(), want 0.
type KeyReport struct {
	Key
	Demand              int64        // cost units attempted in the epoch, allowed or not
	Admitted            int64        // cost units admitted in the epoch
	SmoothedDemandMilli int64        // the sender's smoothed demand, milli cost units per second
	Share               shares.Share // the share the sender enforces now (its claim)
	Want                shares.Share // how much the sender asks to grow (see shares.Config.Want)
	// Removed, only in a delta (Report.Base > 0): the key was in the base
	// report and is not in this one (it claims the default, demand 0,
	// want 0); the other fields are zero.
	Removed bool
}

// Heard says the sender has received a report of Region for epochs up to
// Epoch.
type Heard struct {
	Region string
	Epoch  int64
}

// Relayed is the heard vector of one report of Region, relayed by another
// region in its own report (the heard matrix; see the package doc, "The
// decision and the partition rule").
type Relayed struct {
	Region  string  // whose report it is
	Epoch   int64   // that report's epoch
	Started int64   // that report's Started (0: not said)
	Heard   []Heard // that report's Heard
}

// Report is one region's usage report for one epoch: what crosses regions
// (package proto carries it on Kafka). Keys are sorted by (PolicyID,
// Subject).
type Report struct {
	Region string  // sender
	Epoch  int64   // floor(unix ms / epoch ms) of the epoch reported
	Seq    int64   // per-region, strictly increasing; the Core uses the epoch number
	Heard  []Heard // the sender's view; includes the sender itself at Epoch
	// Started is the first epoch the sender's Core collected; 0 when the
	// sender does not say (an older version). A receiver uses Heard as
	// evidence for the majority rule only when Epoch - Started > K.
	Started int64
	// Relay is, for each other region the sender knows of, the heard vector
	// of the newest report of that region it knows (received directly or
	// relayed to it): the heard matrix. Empty from older senders.
	Relay []Relayed
	Keys  []KeyReport
	// Base is 0 for a full report (Keys lists every key the sender
	// reports). Base > 0 makes the report a delta relative to the sender's
	// full report of epoch Base (Base < Epoch, same Started): its keys are
	// the base's, with each key of Keys replacing or adding to the base's
	// line and each Removed key taken out. A key the delta does not list
	// has the base's line: its Share and Want equal the base's exactly,
	// its demand fields are within Config.DeltaDemandPermille of the
	// base's. See the package doc, "Delta reports".
	Base int64
	// AcceptsDelta: the sender can apply deltas (every Core can). A Core
	// sends deltas only while every region it hears says so.
	AcceptsDelta bool
}

// Update is one share record to write to this region's store.
type Update struct {
	Key
	// Share is the share to enforce (when Delete is false).
	Share shares.Share
	// Delete means the share is the default: remove the record (a key with
	// no record gets the default share).
	Delete bool
	// ExpireAt is when the record must expire (Redis PEXPIREAT); zero when
	// Delete. Records above the default expire Config.RecordEpochs epochs
	// after the start of the epoch of the decision that bounds them (the
	// epoch decided, or the last one decided for a write between
	// decisions), the others IdleTTLEpochs after it.
	ExpireAt time.Time
}

// Policies gives the global limit of a policy. It must not block; the Core
// calls it at most once per key and epoch (within one Collect or decision
// it reuses the last answer for the next key of the same policy).
type Policies interface {
	// Limit returns the policy's limit (rate, burst, regions count) and
	// whether the policy is known.
	Limit(policyID string) (shares.Limit, bool)
}

// SubjectPolicies is a Policies that also knows per-subject limits (the
// admin API's overrides). When the Core's Policies implements it, every
// key's share is computed from the limit in force for its subject at the
// time of the collection or decision: the override's while it is in
// force, the policy's once it expired or was deleted, so the shares the
// coordinator writes follow what the gateways enforce (they apply the
// same override to the same policy, default share included).
type SubjectPolicies interface {
	Policies
	// SubjectLimit returns the limit in force for subject (the limiter's
	// encoded subject, as in Key) under policyID at now, and true when an
	// override replaces the policy's limit; false when the policy's limit
	// applies. Same rules as Limit: it must not block, and it is called
	// once per key per collection and decision.
	SubjectLimit(policyID, subject string, now time.Time) (shares.Limit, bool)
}

// PolicyMap is a Policies backed by a map; it is not safe to change while a
// Core uses it.
type PolicyMap map[string]shares.Limit

// Limit implements Policies.
func (m PolicyMap) Limit(policyID string) (shares.Limit, bool) {
	l, ok := m[policyID]
	return l, ok
}

// UsageSource is what a driver reads the gateways' flushed usage from (this
// region's Redis). The Core never calls it.
type UsageSource interface {
	// Usage returns the usage flushed for epoch, and removes it from the
	// source only when it is returned without error. The caller owns the
	// slice. An error wrapping ErrUsageIncomplete comes with the usage
	// that was read, which is a lower bound of the epoch's (the driver
	// collects it with Core.CollectIncomplete); any other error means
	// nothing was read, and the driver collects the epoch with its usage
	// unknown (Core.CollectUnknown).
	Usage(ctx context.Context, epoch int64) ([]Usage, error)
}

// ShareSink is where a driver writes share updates (this region's Redis,
// pipelined). The Core never calls it.
type ShareSink interface {
	// Write applies the updates. An error means some may not have been
	// applied; the driver must not publish the next report until they
	// are (the report claims them).
	Write(ctx context.Context, updates []Update) error
}

// Bus carries reports between regions (Kafka, at least once). The Core
// never calls it.
type Bus interface {
	// Publish sends a report to every region. The bus does not keep r.
	Publish(ctx context.Context, r *Report) error
	// Receive blocks until a report from any region arrives (its own
	// included) or ctx ends. The caller owns the report.
	Receive(ctx context.Context) (*Report, error)
}

// ReportHistory tells a starting driver whether its region published a
// report recently (DriverConfig.History; rebalancer/kafkabus.Bus in
// production). The Core never calls it.
type ReportHistory interface {
	// Published reports whether the bus holds a report of region in a
	// record timestamped at or after since, having read every record the
	// bus held when the call began. It answers false only when it can
	// prove that: an error means it cannot (records of the span may have
	// been removed, or not all could be read), and the caller warms up.
	Published(ctx context.Context, region string, since time.Time) (bool, error)
}

// Receipt says what Receive did with a report.
type Receipt uint8

const (
	// Accepted: the report is new and was stored.
	Accepted Receipt = iota
	// Duplicate: the same (region, epoch, seq) was already stored; nothing changed.
	Duplicate
	// Conflict: a report with the same (region, epoch) but another seq was
	// already stored; the first one is kept and nothing changed.
	Conflict
	// Stale: the epoch is already decided and newer reports of the region
	// are known; nothing changed.
	Stale
	// Own: the report is this region's own; nothing changed.
	Own
	// Future: the report's epoch is after the receiver's current epoch,
	// beyond what the clock assumption allows (see Core.ReceiveAt);
	// nothing changed.
	Future
	// Unbased: the report is a delta (Report.Base > 0) whose base this
	// Core does not hold (lost, not arrived yet, or another base than the
	// sender's latest full report it holds): it was not applied, and the
	// region counts as not heard for the report's epoch, exactly as if the
	// report had been lost. Nothing changed.
	Unbased
)

// String returns the receipt's name.
func (r Receipt) String() string {
	switch r {
	case Accepted:
		return "accepted"
	case Duplicate:
		return "duplicate"
	case Conflict:
		return "conflict"
	case Stale:
		return "stale"
	case Own:
		return "own"
	case Future:
		return "future"
	case Unbased:
		return "unbased"
	}
	return "unknown"
}

// EpochOf returns the number of the epoch that t falls in:
// floor(unix ms / epoch ms). epoch must be at least a millisecond.
func EpochOf(t time.Time, epoch time.Duration) int64 {
	ms, e := t.UnixMilli(), epoch.Milliseconds()
	q := ms / e
	if ms%e != 0 && ms < 0 {
		q--
	}
	return q
}

// EpochStart returns when epoch number n starts.
func EpochStart(n int64, epoch time.Duration) time.Time {
	return time.UnixMilli(n * epoch.Milliseconds())
}
