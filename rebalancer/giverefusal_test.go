package rebalancer

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/shares"
)

// Every give that raises nothing says why, one reason per cause.
func TestGiveRefusalReasons(t *testing.T) {
	amt := shares.Share{RateMilli: 10_000, BurstMilli: 20_000}
	other := Key{PolicyID: "gone", Subject: "k:1"}
	// gift is a give from a to b for the period b expects, of keys.
	gift := func(p *tpair, id int64, keys ...Key) *Give {
		g := &Give{From: "a", To: "b", ID: id, Transfer: p.m + 1}
		for _, k := range keys {
			g.Keys = append(g.Keys, GiveKey{Key: k, Amount: amt})
		}
		return g
	}
	for _, tc := range []struct {
		name string
		// setup returns the Core that receives and the give.
		setup func(t *testing.T, p *tpair) (*Core, *Give)
		want  GiveRefusal
	}{
		{"accepted", func(_ *testing.T, p *tpair) (*Core, *Give) { return p.b, gift(p, 1, hot) }, GiveAccepted},
		{"invalid", func(_ *testing.T, p *tpair) (*Core, *Give) {
			g := gift(p, 1, hot, hot)
			return p.b, g
		}, RefusedInvalid},
		{"other region", func(_ *testing.T, p *tpair) (*Core, *Give) {
			g := gift(p, 1, hot)
			g.From, g.To = "b", "a"
			return p.b, g
		}, RefusedOtherRegion},
		{"disabled", func(_ *testing.T, p *tpair) (*Core, *Give) {
			p.b.cfg.Transfers = false
			return p.b, gift(p, 1, hot)
		}, RefusedDisabled},
		{"warm-up", func(t *testing.T, p *tpair) (*Core, *Give) {
			fresh, err := New(testConfig("b", "a", "b"), xpol)
			require.NoError(t, err)
			_, err = fresh.Collect(EpochStart(p.m+1, 10*time.Second).Add(time.Second), nil)
			require.NoError(t, err)
			require.True(t, fresh.warm(fresh.published))
			return fresh, gift(p, 1, hot)
		}, RefusedWarmup},
		{"nothing collected since a start", func(t *testing.T, p *tpair) (*Core, *Give) {
			fresh, err := New(testConfig("b", "a", "b"), xpol)
			require.NoError(t, err)
			return fresh, gift(p, 1, hot)
		}, RefusedWarmup},
		{"no report (adopted, nothing collected)", func(t *testing.T, p *tpair) (*Core, *Give) {
			fresh, err := New(testConfig("b", "a", "b"), xpol)
			require.NoError(t, err)
			_, err = fresh.Adopt(p.now(), nil)
			require.NoError(t, err)
			return fresh, gift(p, 1, hot)
		}, RefusedNoReport},
		{"fallback", func(_ *testing.T, p *tpair) (*Core, *Give) {
			p.cutOff(false)
			return p.b, gift(p, 1, hot)
		}, RefusedFallback},
		{"duplicate", func(t *testing.T, p *tpair) (*Core, *Give) {
			g := gift(p, 1, hot)
			ups, err := p.b.ReceiveGive(p.now(), g)
			require.NoError(t, err)
			require.Len(t, ups, 1)
			return p.b, g
		}, RefusedDuplicate},
		{"another period", func(_ *testing.T, p *tpair) (*Core, *Give) {
			g := gift(p, 1, hot)
			g.Transfer++
			return p.b, g
		}, RefusedEpoch},
		{"given here", func(t *testing.T, p *tpair) (*Core, *Give) {
			give := p.transfer(p.now()) // a gives hot to b
			require.NotNil(t, give)
			back := &Give{From: "b", To: "a", ID: 7, Transfer: p.m + 1, Keys: []GiveKey{{Key: hot, Amount: amt}}}
			return p.a, back
		}, RefusedGivenHere},
		{"unknown policy", func(_ *testing.T, p *tpair) (*Core, *Give) { return p.b, gift(p, 1, other) }, RefusedUnknownPolicy},
		{"no room", func(_ *testing.T, p *tpair) (*Core, *Give) {
			p.b.held(hot).share = shares.Share{RateMilli: xlim.RateMilli, BurstMilli: xlim.BurstMilli}
			return p.b, gift(p, 1, hot)
		}, RefusedNoRoom},
		{"no keys", func(_ *testing.T, p *tpair) (*Core, *Give) { return p.b, gift(p, 1) }, RefusedNoRoom},
		{"most keys' cause", func(_ *testing.T, p *tpair) (*Core, *Give) {
			// Two keys with nothing to raise (one at its limit, one given
			// nothing), one of an unknown policy.
			p.b.held(hot).share = shares.Share{RateMilli: xlim.RateMilli, BurstMilli: xlim.BurstMilli}
			g := gift(p, 1, other, hot)
			g.Keys = append(g.Keys, GiveKey{Key: Key{PolicyID: "api", Subject: "acct-2"}})
			return p.b, g
		}, RefusedNoRoom},
		{"a tie of causes", func(_ *testing.T, p *tpair) (*Core, *Give) {
			p.b.held(hot).share = shares.Share{RateMilli: xlim.RateMilli, BurstMilli: xlim.BurstMilli}
			return p.b, gift(p, 1, other, hot)
		}, RefusedUnknownPolicy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTransferPair(t)
			c, g := tc.setup(t, p)
			ups, why, err := c.ReceiveGiveReason(p.now(), g)
			assert.Equal(t, tc.want, why, "got %s", why)
			if tc.want == RefusedInvalid {
				require.ErrorIs(t, err, ErrTransfer)
				return
			}
			require.NoError(t, err)
			if tc.want == GiveAccepted {
				assert.NotEmpty(t, ups)
			} else {
				assert.Empty(t, ups)
			}
		})
	}
}

func TestGiveRefusalNames(t *testing.T) {
	names := map[string]bool{}
	for _, r := range GiveRefusals() {
		assert.NotEqual(t, GiveAccepted, r)
		assert.NotEqual(t, "unknown", r.String(), "%d has a name", r)
		names[r.String()] = true
	}
	assert.Len(t, names, len(GiveRefusals()), "names are distinct")
	assert.Equal(t, []string{"invalid", "other_region", "disabled", "warmup", "no_report", "fallback", "duplicate", "epoch", "given_here", "unknown_policy", "no_room"},
		func() (out []string) {
			for _, r := range GiveRefusals() {
				out = append(out, r.String())
			}
			return out
		}())
	assert.Equal(t, "accepted", GiveAccepted.String())
	assert.Equal(t, "unknown", GiveRefusal(200).String())
}

// The driver passes a refusal's reason to its observer and logs it at
// debug level with the give's keys and epochs; at info level it logs
// nothing.
func TestDriverReportsGiveRefusal(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelDebug, slog.LevelInfo} {
		t.Run(level.String(), func(t *testing.T) {
			p := newTransferPair(t)
			w := newWorld(t, []string{"a", "b"}, xlim, []Key{hot})
			var logs bytes.Buffer
			obs := &transferLog{}
			d, err := NewDriver(p.b, DriverConfig{
				Usage: &fakeSource{w: w, region: "b"}, Shares: &fakeSink{w: w, region: "b"}, Bus: w.ports["b"],
				Logger:   slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: level})),
				Observer: obs, Pressure: &fakePressure{w: w, region: "b", epoch: 10 * time.Second},
				Transfers: &memTransfers{w: w, region: "b", inbox: make(chan transferIn, 1)},
			})
			require.NoError(t, err)
			late := &Give{From: "a", To: "b", ID: 3, Transfer: p.m + 2, Keys: []GiveKey{{Key: hot, Amount: shares.Share{RateMilli: 1000}}}}
			d.acceptGive(context.Background(), late)
			unknown := &Give{From: "a", To: "b", ID: 4, Transfer: p.m + 1, Keys: []GiveKey{{Key: Key{PolicyID: "gone", Subject: "k:9"}, Amount: shares.Share{RateMilli: 1000}}}}
			d.acceptGive(context.Background(), unknown)

			require.Len(t, obs.infos, 2)
			for i, want := range []GiveRefusal{RefusedEpoch, RefusedUnknownPolicy} {
				assert.Equal(t, GiveReceived, obs.infos[i].Kind)
				assert.False(t, obs.infos[i].Accepted)
				assert.Equal(t, ReasonCore, obs.infos[i].Reason)
				assert.Equal(t, want, obs.infos[i].Refusal)
			}
			assert.Equal(t, int64(2), d.Status().Transfers.GivesRefused)
			if level == slog.LevelInfo {
				assert.Empty(t, logs.String())
				return
			}
			lines := bytes.Split(bytes.TrimSpace(logs.Bytes()), []byte("\n"))
			require.Len(t, lines, 2, logs.String())
			assert.Contains(t, string(lines[0]), "level=DEBUG")
			assert.Contains(t, string(lines[0]), "give refused")
			assert.Contains(t, string(lines[0]), "reason=epoch")
			assert.Contains(t, string(lines[0]), "transfer_epoch="+strconv.FormatInt(p.m+2, 10))
			assert.Contains(t, string(lines[0]), "collected_epoch="+strconv.FormatInt(p.m, 10))
			assert.Contains(t, string(lines[0]), "key=["+hot.PolicyID+"/"+hot.Subject+"]")
			assert.Contains(t, string(lines[1]), "reason=unknown_policy")
			assert.Contains(t, string(lines[1]), "key=[gone/k:9]")
		})
	}
}
