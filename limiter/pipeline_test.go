package limiter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

// TestPipelinedStoreMatchesMemory: 32 goroutines, one subject each, send
// random sequences through one pipelined store at once, so batches mix
// subjects; every subject's decisions must equal the in-memory store's
// replay of the same sequence (subjects are independent, so the batching
// order cannot matter).
func TestPipelinedStoreMatchesMemory(t *testing.T) {
	srv := redistest.StartServer(t)
	store, err := NewPipelinedRedisStore(srv.Client(), PipelineConfig{Workers: 2, MaxBatch: 16})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	store.decideAtGivenTime()
	ps, err := ParsePolicies([]byte(`[
		{"id":"tb","algorithm":"token_bucket","rate_per_sec":5,"burst":10},
		{"id":"sl","algorithm":"sliding_window_log","limit":7,"window_s":3}]`))
	require.NoError(t, err)
	lr, err := New(Config{Store: store}, ps)
	require.NoError(t, err)

	type step struct {
		at   time.Time
		cost int64
	}
	const subjects, steps = 32, 300
	seqs := make([][]step, subjects)
	start := time.Now().Add(time.Hour)
	for s := range seqs {
		rng := rand.New(rand.NewPCG(uint64(s), 9))
		now := start
		for range steps {
			now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
			seqs[s] = append(seqs[s], step{at: now, cost: 1 + rng.Int64N(3)})
		}
	}
	got := make([][]Decision, subjects)
	var wg sync.WaitGroup
	for s := range seqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			subj := Subject{Kind: SubjectAPIKey, Value: fmt.Sprintf("p-%d", s)}
			for _, st := range seqs[s] {
				d, err := lr.CheckSubjectAt(context.Background(), st.at, subj, ps, st.cost)
				if !assert.NoError(t, err) {
					return
				}
				got[s] = append(got[s], d)
			}
		}()
	}
	wg.Wait()
	mem := NewMemoryStore()
	mem.keepExpired = true
	lm, err := New(Config{Store: mem}, ps)
	require.NoError(t, err)
	rejected := 0
	for s := range seqs {
		subj := Subject{Kind: SubjectAPIKey, Value: fmt.Sprintf("p-%d", s)}
		for i, st := range seqs[s] {
			want, err := lm.CheckSubjectAt(context.Background(), st.at, subj, ps, st.cost)
			require.NoError(t, err)
			require.Equal(t, want, got[s][i], "subject %d step %d", s, i)
			if !want.Allowed {
				rejected++
			}
		}
	}
	require.Greater(t, rejected, subjects*steps/20, "the sequences must exercise rejections")
}

// TestPipelinedStoreReloadsTheScript: after SCRIPT FLUSH (a restarted or
// failed-over Redis) the pipeline re-sends with EVAL and goes on.
func TestPipelinedStoreReloadsTheScript(t *testing.T) {
	srv := redistest.StartServer(t)
	store, err := NewPipelinedRedisStore(srv.Client(), DefaultPipelineConfig())
	require.NoError(t, err)
	t.Cleanup(store.Close)
	ps, err := ParsePolicies([]byte(`[{"id":"tb","algorithm":"token_bucket","rate_per_sec":5,"burst":10}]`))
	require.NoError(t, err)
	l, err := New(Config{Store: store, Deadline: time.Second}, ps)
	require.NoError(t, err)
	ctx := context.Background()
	subj := Subject{Kind: SubjectAPIKey, Value: "k"}
	d, err := l.CheckSubjectAt(ctx, time.Now(), subj, ps, 1)
	require.NoError(t, err)
	assert.Equal(t, int64(9), d.Policies[0].Remaining)
	require.NoError(t, srv.Client().ScriptFlush(ctx).Err())
	d, err = l.CheckSubjectAt(ctx, time.Now(), subj, ps, 1)
	require.NoError(t, err)
	assert.Equal(t, int64(8), d.Policies[0].Remaining)
}

// TestPipelinedStoreClose: after Close a decision fails at once as a store
// failure, and Check answers from the fallback.
func TestPipelinedStoreClose(t *testing.T) {
	srv := redistest.StartServer(t)
	store, err := NewPipelinedRedisStore(srv.Client(), DefaultPipelineConfig())
	require.NoError(t, err)
	store.Close()
	store.Close() // idempotent
	ps, err := ParsePolicies([]byte(`[{"id":"tb","algorithm":"token_bucket","rate_per_sec":5,"burst":10}]`))
	require.NoError(t, err)
	l, err := New(Config{Store: store}, ps)
	require.NoError(t, err)
	_, err = l.CheckSubjectAt(context.Background(), time.Now(), Subject{Kind: SubjectAPIKey, Value: "k"}, ps, 1)
	require.ErrorIs(t, err, ErrStoreUnavailable)
	d, err := l.Check(context.Background(), Request{Identity: Identity{APIKey: "k"}})
	require.NoError(t, err)
	assert.Equal(t, SourceFallback, d.Source)
}

func TestPipelineConfigErrorsNameTheField(t *testing.T) {
	for _, c := range []struct {
		cfg   PipelineConfig
		field string
	}{
		{PipelineConfig{Workers: -1}, "Workers"},
		{PipelineConfig{MaxBatch: 5000}, "MaxBatch"},
		{PipelineConfig{Timeout: -time.Second}, "Timeout"},
	} {
		_, err := NewPipelinedRedisStore(nil, c.cfg)
		assert.ErrorContains(t, err, c.field)
	}
}
