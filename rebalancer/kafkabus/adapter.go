package kafkabus

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/shares"
)

// ErrEpochMismatch is wrapped by FromProto when a report's epoch length is
// not the receiver's: the sender numbers epochs differently, so its report
// cannot be applied (regions must run the same --epoch).
var ErrEpochMismatch = errors.New("kafkabus: epoch length mismatch")

// ErrPartsMismatch is wrapped by the error an Adapter's Run passes to
// OnReject for a report whose key_parts is not the adapter's: the sender's
// coordinator splits the key space differently (regions must run the same
// --parts), so its report cannot be routed to one part's Core.
var ErrPartsMismatch = errors.New("kafkabus: key parts mismatch")

// ToProto converts a rebalancer report to its wire form: epoch is the epoch
// length (a whole number of milliseconds), sent the publisher's clock (for
// lag metrics only). r is not modified and not referenced by the result's
// header (keys are copied). A delta (r.Base > 0) goes with epoch_ms 0 and
// the epoch length in delta_epoch_ms, so that a receiver that predates
// deltas rejects it.
func ToProto(r *rebalancer.Report, epoch time.Duration, sent time.Time) *quotientv1.UsageReport {
	p := &quotientv1.UsageReport{
		Region: r.Region, Epoch: r.Epoch, EpochMs: epoch.Milliseconds(), Seq: r.Seq,
		SentUnixMs: sent.UnixMilli(),
		Heard:      make([]*quotientv1.RegionHeard, len(r.Heard)),
		Keys:       make([]*quotientv1.KeyUsage, len(r.Keys)),
	}
	for i, h := range r.Heard {
		p.Heard[i] = &quotientv1.RegionHeard{Region: h.Region, LastEpoch: h.Epoch}
	}
	p.StartedEpoch = r.Started
	p.AcceptsDelta = r.AcceptsDelta
	if r.Base > 0 {
		p.BaseEpoch, p.EpochMs, p.DeltaEpochMs = r.Base, 0, epoch.Milliseconds()
	}
	if len(r.Relay) > 0 {
		p.Relayed = make([]*quotientv1.RelayedHeard, len(r.Relay))
		for i, rr := range r.Relay {
			hs := make([]*quotientv1.RegionHeard, len(rr.Heard))
			for j, h := range rr.Heard {
				hs[j] = &quotientv1.RegionHeard{Region: h.Region, LastEpoch: h.Epoch}
			}
			p.Relayed[i] = &quotientv1.RelayedHeard{Region: rr.Region, Epoch: rr.Epoch, StartedEpoch: rr.Started, Heard: hs}
		}
	}
	// One backing array for every key: 100k small allocations cost more
	// than the encoding.
	keys := make([]quotientv1.KeyUsage, len(r.Keys))
	for i := range r.Keys {
		k := &r.Keys[i]
		ku := &keys[i]
		ku.PolicyId, ku.Subject = k.PolicyID, k.Subject
		ku.Demand, ku.Admitted, ku.SmoothedDemandMilli = k.Demand, k.Admitted, k.SmoothedDemandMilli
		ku.ShareRateMilli, ku.ShareBurstMilli = k.Share.RateMilli, k.Share.BurstMilli
		ku.WantRateMilli, ku.WantBurstMilli = k.Want.RateMilli, k.Want.BurstMilli
		ku.Removed = k.Removed
		p.Keys[i] = ku
	}
	return p
}

// FromProto converts a whole received report (as Bus.Run delivers it) to a
// rebalancer report. It checks only what the conversion needs: the report
// is whole (parts <= 1), has no nil entries, and its epoch length equals
// epoch (else ErrEpochMismatch): epoch_ms for a full report, delta_epoch_ms
// with epoch_ms 0 for a delta (base_epoch > 0); the rebalancer Core
// validates the values. Errors name the field.
func FromProto(p *quotientv1.UsageReport, epoch time.Duration) (*rebalancer.Report, error) {
	switch {
	case p == nil:
		return nil, fmt.Errorf("%w: report is nil", ErrInvalidReport)
	case p.GetParts() > 1 || p.GetPart() != 0:
		return nil, fmt.Errorf("%w: region %q epoch %d: part %d of %d, want a whole report", ErrInvalidReport, p.GetRegion(), p.GetEpoch(), p.GetPart(), p.GetParts())
	case p.GetBaseEpoch() == 0 && p.GetEpochMs() != epoch.Milliseconds():
		return nil, fmt.Errorf("%w: region %q epoch %d: epoch_ms %d, this region uses %d", ErrEpochMismatch, p.GetRegion(), p.GetEpoch(), p.GetEpochMs(), epoch.Milliseconds())
	case p.GetBaseEpoch() != 0 && (p.GetEpochMs() != 0 || p.GetDeltaEpochMs() != epoch.Milliseconds()):
		return nil, fmt.Errorf("%w: region %q epoch %d: delta of base %d with epoch_ms %d and delta_epoch_ms %d, this region uses 0 and %d",
			ErrEpochMismatch, p.GetRegion(), p.GetEpoch(), p.GetBaseEpoch(), p.GetEpochMs(), p.GetDeltaEpochMs(), epoch.Milliseconds())
	}
	r := &rebalancer.Report{
		Region: p.GetRegion(), Epoch: p.GetEpoch(), Seq: p.GetSeq(),
		Heard: make([]rebalancer.Heard, 0, len(p.GetHeard())),
		Keys:  make([]rebalancer.KeyReport, len(p.GetKeys())),
	}
	for i, h := range p.GetHeard() {
		if h == nil {
			return nil, fmt.Errorf("%w: region %q epoch %d: heard[%d] is nil", ErrInvalidReport, p.GetRegion(), p.GetEpoch(), i)
		}
		r.Heard = append(r.Heard, rebalancer.Heard{Region: h.GetRegion(), Epoch: h.GetLastEpoch()})
	}
	r.Started = p.GetStartedEpoch()
	r.Base, r.AcceptsDelta = p.GetBaseEpoch(), p.GetAcceptsDelta()
	for i, rr := range p.GetRelayed() {
		if rr == nil {
			return nil, fmt.Errorf("%w: region %q epoch %d: relayed[%d] is nil", ErrInvalidReport, p.GetRegion(), p.GetEpoch(), i)
		}
		out := rebalancer.Relayed{Region: rr.GetRegion(), Epoch: rr.GetEpoch(), Started: rr.GetStartedEpoch(), Heard: make([]rebalancer.Heard, 0, len(rr.GetHeard()))}
		for j, h := range rr.GetHeard() {
			if h == nil {
				return nil, fmt.Errorf("%w: region %q epoch %d: relayed[%d].heard[%d] is nil", ErrInvalidReport, p.GetRegion(), p.GetEpoch(), i, j)
			}
			out.Heard = append(out.Heard, rebalancer.Heard{Region: h.GetRegion(), Epoch: h.GetLastEpoch()})
		}
		r.Relay = append(r.Relay, out)
	}
	for i, k := range p.GetKeys() {
		if k == nil {
			return nil, fmt.Errorf("%w: region %q epoch %d: keys[%d] is nil", ErrInvalidReport, p.GetRegion(), p.GetEpoch(), i)
		}
		r.Keys[i] = rebalancer.KeyReport{
			Key:    rebalancer.Key{PolicyID: k.GetPolicyId(), Subject: k.GetSubject()},
			Demand: k.GetDemand(), Admitted: k.GetAdmitted(), SmoothedDemandMilli: k.GetSmoothedDemandMilli(),
			Share:   shares.Share{RateMilli: k.GetShareRateMilli(), BurstMilli: k.GetShareBurstMilli()},
			Want:    shares.Share{RateMilli: k.GetWantRateMilli(), BurstMilli: k.GetWantBurstMilli()},
			Removed: k.GetRemoved(),
		}
	}
	return r, nil
}

// AdapterStats counts what an Adapter did.
type AdapterStats struct {
	Delivered int64 // reports handed to Receive
	Rejected  int64 // reports FromProto rejected (malformed, other epoch length)
	// PartsMismatch counts reports dropped because their key_parts is not
	// the adapter's (also in Rejected).
	PartsMismatch int64
	// OtherPart counts reports of another key part that were decoded and
	// then skipped (not errors; most are skipped undecoded, by message key,
	// and counted in Stats.SkippedParts only).
	OtherPart int64
}

// Adapter makes a Bus a rebalancer.Bus: Publish converts and sends a
// rebalancer.Report, Run consumes (Bus.Run) and converts, Receive hands
// the converted reports out one at a time. Run must be running for Receive
// to return reports; while nobody calls Receive, Run blocks on a small
// buffer, which stalls the consumer (backpressure, nothing dropped).
// Reports FromProto rejects are counted and dropped.
//
// Construct with NewAdapter. Publish, Receive and Stats are safe for
// concurrent use; run one Run at a time.
type Adapter struct {
	bus      *Bus
	epoch    time.Duration
	now      func() time.Time
	ch       chan *rebalancer.Report
	rejected atomic.Int64
	deliv    atomic.Int64
	mismatch atomic.Int64
	other    atomic.Int64
	part     int32 // this adapter's key part, 0 <= part < parts
	parts    int32 // key parts, >= 1; 1 is the whole key space (no key_part on the wire)
	// OnReject, when set before Run, is called (from Run's goroutine) with
	// each rejected report's error, e.g. to log it.
	OnReject func(error)
}

var _ rebalancer.Bus = (*Adapter)(nil)
var _ rebalancer.ReportHistory = (*Adapter)(nil)

// Published implements rebalancer.ReportHistory with Bus.Published.
func (a *Adapter) Published(ctx context.Context, region string, since time.Time) (bool, error) {
	return a.bus.Published(ctx, region, since)
}

// NewAdapter returns an adapter over bus for epochs of length epoch (the
// rebalancer's Config.Epoch). now stamps sent_unix_ms; nil is time.Now.
func NewAdapter(bus *Bus, epoch time.Duration, now func() time.Time) (*Adapter, error) {
	now, err := adapterArgs("adapter", bus == nil, epoch, now)
	if err != nil {
		return nil, err
	}
	return &Adapter{bus: bus, epoch: epoch, now: now, ch: make(chan *rebalancer.Report, 16), parts: 1}, nil
}

// NewPartAdapter is NewAdapter for one key part of a coordinator that
// splits the key space into parts parts (parts >= 1, 0 <= part < parts):
// Publish marks its reports key_part = part, key_parts = parts (nothing
// with parts 1: the wire format of a coordinator without parts), and Run
// delivers only the reports of key part part, skipping the other parts'
// (AdapterStats.OtherPart) and rejecting those whose key_parts differs
// (ErrPartsMismatch; a report without key_parts is of part 0 of 1). Each
// part's adapter reads only its part's partition of each topic
// (Bus.RunPart: PartitionOf(part, n), where Publish places the part's
// reports, plus the partitions no part's reports are placed on), and
// decodes only the messages keyed with its own part (or with no part, or a
// part beyond parts): a replica running k of the parts fetches its parts'
// messages, not the whole topic k times. So a mismatch is seen by the
// part whose partition the other sender's report lands on: every
// report of a sender without parts reaches exactly one part's consumer of
// each region (at least one, with fewer partitions than parts), not every
// part's.
func NewPartAdapter(bus *Bus, epoch time.Duration, now func() time.Time, part, parts int) (*Adapter, error) {
	if parts < 1 || parts > maxKeyParts || part < 0 || part >= parts {
		return nil, fmt.Errorf("%w: adapter: part %d of %d, want 0 <= part < parts <= %d", ErrConfig, part, parts, maxKeyParts)
	}
	a, err := NewAdapter(bus, epoch, now)
	if err != nil {
		return nil, err
	}
	a.part, a.parts = int32(part), int32(parts)
	return a, nil
}

// Publish implements rebalancer.Bus: it converts r and publishes it as
// Bus.Publish does (blocking until acknowledged by all in-sync replicas,
// or failing), the same bytes as Bus.Publish(ToProto(r, ...)) but without
// the copy of its keys.
func (a *Adapter) Publish(ctx context.Context, r *rebalancer.Report) error {
	if r == nil {
		return fmt.Errorf("%w: report is nil", ErrInvalidReport)
	}
	// The header converted; the keys encoded from r itself (keycodec.go),
	// not copied into a KeyUsage each (unless the benchmarks ask for the
	// generic path).
	head := *r
	if !a.bus.protoKeys {
		head.Keys = nil
	}
	p := ToProto(&head, a.epoch, a.now())
	if a.parts > 1 {
		p.KeyPart, p.KeyParts = a.part, a.parts
	}
	if a.bus.protoKeys {
		return a.bus.Publish(ctx, p)
	}
	return a.bus.publish(ctx, p, reportKeys(r.Keys))
}

// Receive implements rebalancer.Bus: it returns the next converted report,
// or ctx's error when ctx ends first.
func (a *Adapter) Receive(ctx context.Context) (*rebalancer.Report, error) {
	select {
	case r := <-a.ch:
		return r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Run consumes with Bus.RunPart (Bus.Run without parts) until ctx ends or
// the consumer fails, and returns its error (ctx.Err() on cancellation).
func (a *Adapter) Run(ctx context.Context) error {
	return a.bus.RunPart(ctx, int(a.part), int(a.parts), func(p *quotientv1.UsageReport) {
		if parts := max(1, p.GetKeyParts()); parts != a.parts {
			a.mismatch.Add(1)
			reject(&a.rejected, a.OnReject, fmt.Errorf("%w: region %q epoch %d: key parts %d, this coordinator uses %d", ErrPartsMismatch, p.GetRegion(), p.GetEpoch(), parts, a.parts))
			return
		}
		if p.GetKeyPart() != a.part {
			a.other.Add(1)
			return
		}
		r, err := FromProto(p, a.epoch)
		if err != nil {
			reject(&a.rejected, a.OnReject, err)
			return
		}
		select {
		case a.ch <- r:
			a.deliv.Add(1)
		case <-ctx.Done():
		}
	})
}

// Stats returns the adapter's counters.
func (a *Adapter) Stats() AdapterStats {
	return AdapterStats{Delivered: a.deliv.Load(), Rejected: a.rejected.Load(), PartsMismatch: a.mismatch.Load(), OtherPart: a.other.Load()}
}

// adapterArgs checks a new adapter's arguments (its bus is not nil:
// noBus false; its epoch length, which goes on the wire as epoch_ms, is a
// positive whole number of milliseconds) and returns its clock: now, or
// time.Now when nil. name starts the error, which wraps ErrConfig.
func adapterArgs(name string, noBus bool, epoch time.Duration, now func() time.Time) (func() time.Time, error) {
	if noBus {
		return nil, fmt.Errorf("%w: %s: bus is nil", ErrConfig, name)
	}
	if epoch < time.Millisecond || epoch%time.Millisecond != 0 {
		return nil, fmt.Errorf("%w: %s: epoch %v is not a positive whole number of milliseconds", ErrConfig, name, epoch)
	}
	if now == nil {
		now = time.Now
	}
	return now, nil
}

// reject counts a message an adapter's Run dropped in n and passes its
// error to onReject, when set.
func reject(n *atomic.Int64, onReject func(error), err error) {
	n.Add(1)
	if onReject != nil {
		onReject(err)
	}
}
