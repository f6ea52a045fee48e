package region

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
)

// fakeTransfers hands out a fixed list of asks and gives, then blocks.
type fakeTransfers struct {
	rebalancer.TransferBus
	msgs []any
}

func (f *fakeTransfers) ReceiveTransfer(ctx context.Context) (*rebalancer.Ask, *rebalancer.Give, error) {
	if len(f.msgs) == 0 {
		<-ctx.Done()
		return nil, nil, ctx.Err()
	}
	m := f.msgs[0]
	f.msgs = f.msgs[1:]
	switch m := m.(type) {
	case *rebalancer.Ask:
		return m, nil, nil
	case *rebalancer.Give:
		return nil, m, nil
	}
	panic("fakeTransfers: not an ask or a give")
}

// TestPartTransfers: a part's transfer bus hands its driver only its
// part's keys of each ask and give, and drops messages with none.
func TestPartTransfers(t *testing.T) {
	const parts = 4
	byPart := map[int][]rebalancer.Key{}
	for i := 0; len(byPart[0]) < 2 || len(byPart[1]) < 2 || len(byPart[2]) < 2; i++ {
		k := rebalancer.Key{PolicyID: "g", Subject: fmt.Sprintf("k:key-%d", i)}
		p := limiter.UsagePart(k.PolicyID, k.Subject, parts)
		byPart[p] = append(byPart[p], k)
	}
	ask := func(keys ...rebalancer.Key) *rebalancer.Ask {
		a := &rebalancer.Ask{Region: "us", Epoch: 1}
		for _, k := range keys {
			a.Keys = append(a.Keys, rebalancer.AskKey{Key: k})
		}
		return a
	}
	give := func(keys ...rebalancer.Key) *rebalancer.Give {
		g := &rebalancer.Give{From: "us", To: "eu", ID: 1, Transfer: 2}
		for _, k := range keys {
			g.Keys = append(g.Keys, rebalancer.GiveKey{Key: k})
		}
		return g
	}
	fake := &fakeTransfers{msgs: []any{
		ask(byPart[0][0], byPart[1][0], byPart[1][1]), // mixed: part 1's two keys
		ask(byPart[0][1]),                // none of part 1: dropped
		give(byPart[2][0]),               // none: dropped
		give(byPart[1][1], byPart[2][1]), // part 1's one key
	}}
	tb := partTransfers{fake, 1, parts}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	a, g, err := tb.ReceiveTransfer(ctx)
	require.NoError(t, err)
	require.Nil(t, g)
	assert.Equal(t, []rebalancer.AskKey{{Key: byPart[1][0]}, {Key: byPart[1][1]}}, a.Keys)
	a, g, err = tb.ReceiveTransfer(ctx)
	require.NoError(t, err)
	require.Nil(t, a)
	assert.Equal(t, []rebalancer.GiveKey{{Key: byPart[1][1]}}, g.Keys)
	cancel()
	_, _, err = tb.ReceiveTransfer(ctx)
	assert.ErrorIs(t, err, context.Canceled)
}
