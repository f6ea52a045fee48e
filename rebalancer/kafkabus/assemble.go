package kafkabus

import (
	"errors"
	"fmt"
	"strconv"

	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
)

// maxParts bounds the parts of one report a receiver will hold, so a
// corrupt parts field cannot make it allocate without bound. 100,000 parts
// of 1 MB are 100 GB, far beyond any real report.
const maxParts = 100_000

// maxKeyParts bounds a report's key_parts, so a corrupt field cannot make
// a receiver keep state for unbounded senders.
const maxKeyParts = 4096

// ErrMalformed marks a message that is not a valid report part.
var ErrMalformed = errors.New("kafkabus: malformed report part")

type reportID struct {
	epoch, seq int64
}

type pendingReport struct {
	parts    []*quotientv1.UsageReport
	received int
}

type regionState struct {
	pending   map[reportID]*pendingReport
	delivered map[reportID]bool
	order     []reportID // delivered IDs, oldest first, at most maxDelivered
}

// assembler joins report parts into whole reports. It is pure (no I/O, no
// clock) and not safe for concurrent use.
type assembler struct {
	maxPending   int // incomplete reports kept per region
	maxDelivered int // delivered IDs remembered per region for dedupe
	regions      map[string]*regionState
}

func newAssembler(maxPending, maxDelivered int) *assembler {
	return &assembler{maxPending: maxPending, maxDelivered: maxDelivered, regions: map[string]*regionState{}}
}

// addResult says what add did with a part.
type addResult int

const (
	partKept      addResult = iota // stored; the report is not complete yet
	partCompleted                  // completed a report, returned whole
	partDuplicate                  // duplicate part or part of a delivered report
)

// add takes one part. It returns the whole report when this part completes
// one, how many incomplete reports it evicted to stay within bounds, and an
// error wrapping ErrMalformed for a part it rejected (state unchanged).
func (a *assembler) add(p *quotientv1.UsageReport) (*quotientv1.UsageReport, addResult, int, error) {
	if err := validatePart(p); err != nil {
		return nil, 0, 0, err
	}
	// Each key part of a region is its own sender (its own protocol
	// instance, numbering its reports by itself).
	sender := p.GetRegion()
	if p.GetKeyParts() > 1 {
		sender += "\x00" + strconv.Itoa(int(p.GetKeyPart()))
	}
	rs := a.regions[sender]
	if rs == nil {
		rs = &regionState{pending: map[reportID]*pendingReport{}, delivered: map[reportID]bool{}}
		a.regions[sender] = rs
	}
	id := reportID{p.GetEpoch(), p.GetSeq()}
	if rs.delivered[id] {
		return nil, partDuplicate, 0, nil
	}
	pr := rs.pending[id]
	if pr == nil && p.GetParts() == 1 {
		return a.complete(rs, id, []*quotientv1.UsageReport{p}), partCompleted, 0, nil
	}
	if pr == nil {
		pr = &pendingReport{parts: make([]*quotientv1.UsageReport, p.GetParts())}
		rs.pending[id] = pr
	}
	if int(p.GetParts()) != len(pr.parts) {
		return nil, 0, 0, fmt.Errorf("%w: region %q epoch %d seq %d: parts %d, but earlier parts said %d",
			ErrMalformed, p.GetRegion(), id.epoch, id.seq, p.GetParts(), len(pr.parts))
	}
	if pr.parts[p.GetPart()] != nil {
		return nil, partDuplicate, 0, nil
	}
	pr.parts[p.GetPart()] = p
	pr.received++
	if pr.received == len(pr.parts) {
		delete(rs.pending, id)
		return a.complete(rs, id, pr.parts), partCompleted, 0, nil
	}
	return nil, partKept, a.evict(rs), nil
}

// evict drops the incomplete reports with the lowest seq until at most
// maxPending remain, and returns how many it dropped.
func (a *assembler) evict(rs *regionState) int {
	n := 0
	for len(rs.pending) > a.maxPending {
		var oldest reportID
		first := true
		for id := range rs.pending {
			if first || id.seq < oldest.seq || (id.seq == oldest.seq && id.epoch < oldest.epoch) {
				oldest, first = id, false
			}
		}
		delete(rs.pending, oldest)
		n++
	}
	return n
}

func (a *assembler) complete(rs *regionState, id reportID, parts []*quotientv1.UsageReport) *quotientv1.UsageReport {
	rs.delivered[id] = true
	rs.order = append(rs.order, id)
	if len(rs.order) > a.maxDelivered {
		delete(rs.delivered, rs.order[0])
		rs.order = rs.order[1:]
	}
	if len(parts) == 1 {
		parts[0].Part, parts[0].Parts = 0, 0
		return parts[0]
	}
	n := 0
	for _, p := range parts {
		n += len(p.GetKeys())
	}
	whole := parts[0]
	keys := make([]*quotientv1.KeyUsage, 0, n)
	for _, p := range parts {
		keys = append(keys, p.GetKeys()...)
	}
	whole.Keys = keys
	whole.Part, whole.Parts = 0, 0
	return whole
}

func validatePart(p *quotientv1.UsageReport) error {
	switch {
	case p.GetRegion() == "":
		return fmt.Errorf("%w: region is empty", ErrMalformed)
	case p.GetParts() < 1 || p.GetParts() > maxParts:
		return fmt.Errorf("%w: region %q epoch %d seq %d: parts %d, want 1..%d",
			ErrMalformed, p.GetRegion(), p.GetEpoch(), p.GetSeq(), p.GetParts(), maxParts)
	case p.GetPart() < 0 || p.GetPart() >= p.GetParts():
		return fmt.Errorf("%w: region %q epoch %d seq %d: part %d, want 0..%d",
			ErrMalformed, p.GetRegion(), p.GetEpoch(), p.GetSeq(), p.GetPart(), p.GetParts()-1)
	case p.GetKeyParts() < 0 || p.GetKeyParts() > maxKeyParts || p.GetKeyPart() < 0 || p.GetKeyPart() >= max(1, p.GetKeyParts()):
		return fmt.Errorf("%w: region %q epoch %d seq %d: key part %d of %d, want 0 <= key_part < key_parts <= %d",
			ErrMalformed, p.GetRegion(), p.GetEpoch(), p.GetSeq(), p.GetKeyPart(), p.GetKeyParts(), maxKeyParts)
	}
	return nil
}
