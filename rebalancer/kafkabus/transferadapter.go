package kafkabus

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/shares"
)

// AskToProto converts an ask to its wire form (epoch is the epoch length,
// sent the publisher's clock). a is not referenced by the result.
func AskToProto(a *rebalancer.Ask, epoch time.Duration, sent time.Time) *quotientv1.TransferAsk {
	p := &quotientv1.TransferAsk{Region: a.Region, Epoch: a.Epoch, EpochMs: epoch.Milliseconds(), SentUnixMs: sent.UnixMilli(),
		Keys: make([]*quotientv1.AskKey, len(a.Keys))}
	for i, k := range a.Keys {
		p.Keys[i] = &quotientv1.AskKey{PolicyId: k.PolicyID, Subject: k.Subject, NeedRateMilli: k.Need.RateMilli, NeedBurstMilli: k.Need.BurstMilli}
	}
	return p
}

// GiveToProto converts a give to its wire form. g is not referenced by the
// result.
func GiveToProto(g *rebalancer.Give, epoch time.Duration, sent time.Time) *quotientv1.TransferGive {
	p := &quotientv1.TransferGive{From: g.From, To: g.To, Id: g.ID, Transfer: g.Transfer, EpochMs: epoch.Milliseconds(), SentUnixMs: sent.UnixMilli(),
		Keys: make([]*quotientv1.GiveKey, len(g.Keys))}
	for i, k := range g.Keys {
		p.Keys[i] = &quotientv1.GiveKey{PolicyId: k.PolicyID, Subject: k.Subject, AmountRateMilli: k.Amount.RateMilli, AmountBurstMilli: k.Amount.BurstMilli}
	}
	return p
}

// TransferFromProto converts a delivered message (checked by Run) to an
// ask or a give; a message whose epoch_ms is not epoch is an error wrapping
// ErrEpochMismatch (the sender numbers epochs differently, so its T or
// epoch means something else here).
func TransferFromProto(m *quotientv1.TransferMessage, epoch time.Duration) (*rebalancer.Ask, *rebalancer.Give, error) {
	if a := m.GetAsk(); a != nil {
		if a.GetEpochMs() != epoch.Milliseconds() {
			return nil, nil, fmt.Errorf("%w: ask of region %q: epoch_ms %d, this region uses %d", ErrEpochMismatch, a.GetRegion(), a.GetEpochMs(), epoch.Milliseconds())
		}
		out := &rebalancer.Ask{Region: a.GetRegion(), Epoch: a.GetEpoch(), Keys: make([]rebalancer.AskKey, len(a.GetKeys()))}
		for i, k := range a.GetKeys() {
			out.Keys[i] = rebalancer.AskKey{Key: rebalancer.Key{PolicyID: k.GetPolicyId(), Subject: k.GetSubject()},
				Need: shares.Share{RateMilli: k.GetNeedRateMilli(), BurstMilli: k.GetNeedBurstMilli()}}
		}
		return out, nil, nil
	}
	g := m.GetGive()
	if g == nil {
		return nil, nil, fmt.Errorf("%w: neither an ask nor a give", ErrInvalidTransfer)
	}
	if g.GetEpochMs() != epoch.Milliseconds() {
		return nil, nil, fmt.Errorf("%w: give %s/%d: epoch_ms %d, this region uses %d", ErrEpochMismatch, g.GetFrom(), g.GetId(), g.GetEpochMs(), epoch.Milliseconds())
	}
	out := &rebalancer.Give{From: g.GetFrom(), To: g.GetTo(), ID: g.GetId(), Transfer: g.GetTransfer(), Keys: make([]rebalancer.GiveKey, len(g.GetKeys()))}
	for i, k := range g.GetKeys() {
		out.Keys[i] = rebalancer.GiveKey{Key: rebalancer.Key{PolicyID: k.GetPolicyId(), Subject: k.GetSubject()},
			Amount: shares.Share{RateMilli: k.GetAmountRateMilli(), BurstMilli: k.GetAmountBurstMilli()}}
	}
	return nil, out, nil
}

// TransferAdapter makes a TransferBus a rebalancer.TransferBus, as Adapter
// does for reports: PublishAsk and PublishGive convert and publish, Run
// consumes and converts, ReceiveTransfer hands the messages out one at a
// time (while nobody receives, Run blocks: backpressure). Messages of
// another epoch length are counted (Rejected) and dropped. Construct with
// NewTransferAdapter; PublishAsk, PublishGive, ReceiveTransfer and Rejected
// are safe for concurrent use; run one Run at a time.
type TransferAdapter struct {
	bus      *TransferBus
	epoch    time.Duration
	now      func() time.Time
	ch       chan transferMsg
	rejected atomic.Int64
	// OnReject, when set before Run, is called from Run's goroutine with
	// each rejected message's error.
	OnReject func(error)
}

type transferMsg struct {
	ask  *rebalancer.Ask
	give *rebalancer.Give
}

var _ rebalancer.TransferBus = (*TransferAdapter)(nil)

// NewTransferAdapter returns an adapter over bus for epochs of length
// epoch; now stamps sent_unix_ms (nil: time.Now).
func NewTransferAdapter(bus *TransferBus, epoch time.Duration, now func() time.Time) (*TransferAdapter, error) {
	now, err := adapterArgs("transfer adapter", bus == nil, epoch, now)
	if err != nil {
		return nil, err
	}
	return &TransferAdapter{bus: bus, epoch: epoch, now: now, ch: make(chan transferMsg, 64)}, nil
}

// PublishAsk implements rebalancer.TransferBus.
func (a *TransferAdapter) PublishAsk(ctx context.Context, ask *rebalancer.Ask) error {
	if ask == nil {
		return fmt.Errorf("%w: ask is nil", ErrInvalidTransfer)
	}
	return a.bus.PublishAsk(ctx, AskToProto(ask, a.epoch, a.now()))
}

// PublishGive implements rebalancer.TransferBus.
func (a *TransferAdapter) PublishGive(ctx context.Context, g *rebalancer.Give) error {
	if g == nil {
		return fmt.Errorf("%w: give is nil", ErrInvalidTransfer)
	}
	return a.bus.PublishGive(ctx, GiveToProto(g, a.epoch, a.now()))
}

// ReceiveTransfer implements rebalancer.TransferBus.
func (a *TransferAdapter) ReceiveTransfer(ctx context.Context) (*rebalancer.Ask, *rebalancer.Give, error) {
	select {
	case m := <-a.ch:
		return m.ask, m.give, nil
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}

// Run consumes with TransferBus.Run until ctx ends or the consumer fails,
// and returns its error.
func (a *TransferAdapter) Run(ctx context.Context) error {
	return a.bus.Run(ctx, func(m *quotientv1.TransferMessage) {
		ask, give, err := TransferFromProto(m, a.epoch)
		if err != nil {
			reject(&a.rejected, a.OnReject, err)
			return
		}
		select {
		case a.ch <- transferMsg{ask: ask, give: give}:
		case <-ctx.Done():
		}
	})
}

// Rejected returns how many messages were dropped for their epoch length.
func (a *TransferAdapter) Rejected() int64 { return a.rejected.Load() }
