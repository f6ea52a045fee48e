package limiter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
				d, err := lr.checkSubjectAt(context.Background(), st.at, subj, ps, st.cost)
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
			want, err := lm.checkSubjectAt(context.Background(), st.at, subj, ps, st.cost)
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
	d, err := l.checkSubjectAt(ctx, time.Now(), subj, ps, 1)
	require.NoError(t, err)
	assert.Equal(t, int64(9), d.Policies[0].Remaining)
	require.NoError(t, srv.Client().ScriptFlush(ctx).Err())
	d, err = l.checkSubjectAt(ctx, time.Now(), subj, ps, 1)
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
	_, err = l.checkSubjectAt(context.Background(), time.Now(), Subject{Kind: SubjectAPIKey, Value: "k"}, ps, 1)
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

// pausedPipeline is a pipelined store with one worker on a real
// redis-server whose writes the test has paused (CLIENT PAUSE WRITE from a
// client of its own), with one call in flight that holds the worker until
// unpause is called: every later call waits in the queue.
func pausedPipeline(t *testing.T, maxQueue int) (store *RedisStore, l *Limiter, admin *redistest.Server, unpause func(), reg *prometheus.Registry) {
	t.Helper()
	srv := redistest.StartServer(t)
	store, err := NewPipelinedRedisStore(srv.Client(), PipelineConfig{Workers: 1, MaxBatch: 1, MaxQueue: maxQueue})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	reg = prometheus.NewRegistry()
	l, err = New(Config{Store: store, Deadline: 10 * time.Second, Metrics: reg}, mustPolicies(t, `[{"id":"tb","algorithm":"token_bucket","rate_per_sec":0.01,"burst":10}]`))
	require.NoError(t, err)
	ctx := context.Background()
	// Load the script first: a paused server would hold SCRIPT LOAD too.
	_, err = l.checkSubjectAt(ctx, time.Now(), Subject{Kind: SubjectAPIKey, Value: "warm"}, l.Policies(), 0)
	require.NoError(t, err)
	pauser := srv.Client()
	require.NoError(t, pauser.Do(ctx, "CLIENT", "PAUSE", 30_000, "WRITE").Err())
	var once sync.Once
	unpause = func() { once.Do(func() { require.NoError(t, pauser.Do(ctx, "CLIENT", "UNPAUSE").Err()) }) }
	t.Cleanup(unpause)
	blocked := make(chan error, 1)
	go func() {
		_, err := l.checkSubjectAt(ctx, time.Now(), Subject{Kind: SubjectAPIKey, Value: "blocker"}, l.Policies(), 1)
		blocked <- err
	}()
	t.Cleanup(func() { unpause(); require.NoError(t, <-blocked) })
	// The worker has taken the blocker once the queue is empty again.
	require.Eventually(t, func() bool { return len(store.pipe.queue) == 0 && store.pipe.inFlight.Load() == 1 }, 10*time.Second, time.Millisecond)
	return store, l, srv, unpause, reg
}

// TestPipelineDropsCallsOfCallersThatLeft: callers with a 20 ms deadline
// queue behind a call that a paused Redis holds, and leave; once Redis
// answers again, none of their calls is sent: their subject's bucket is
// untouched (before the fix they were sent and consumed, while the
// fallback had answered them too).
func TestPipelineDropsCallsOfCallersThatLeft(t *testing.T) {
	_, l, srv, unpause, _ := pausedPipeline(t, 64)
	subj := Subject{Kind: SubjectAPIKey, Value: "gone"}
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		_, err := l.checkSubjectAt(ctx, time.Now(), subj, l.Policies(), 1)
		cancel()
		require.ErrorIs(t, err, ErrStoreUnavailable)
	}
	unpause()
	// One worker takes calls in order: when this one is answered, the five
	// before it were either sent or dropped.
	d, err := l.checkSubjectAt(context.Background(), time.Now(), Subject{Kind: SubjectAPIKey, Value: "after"}, l.Policies(), 1)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	n, err := srv.Client().Exists(context.Background(), StateKey(subj, l.Policies()[0])).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(0), n, "no call of a caller that left reached Redis")
}

// TestPipelineShedsWhenFull: with MaxQueue calls waiting, the next call
// fails at once with ErrPipelineFull (a store error) instead of waiting,
// and Check answers it from the fallback well before its deadline.
func TestPipelineShedsWhenFull(t *testing.T) {
	_, l, _, unpause, reg := pausedPipeline(t, 2)
	subj := Subject{Kind: SubjectAPIKey, Value: "waiting"}
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = l.checkSubjectAt(context.Background(), time.Now(), subj, l.Policies(), 1)
		}()
	}
	t.Cleanup(func() { unpause(); wg.Wait() })
	require.Eventually(t, func() bool { return len(l.store.(*RedisStore).pipe.queue) == 2 }, 10*time.Second, time.Millisecond)
	_, err := l.checkSubjectAt(context.Background(), time.Now(), subj, l.Policies(), 1)
	require.ErrorIs(t, err, ErrPipelineFull)
	require.ErrorIs(t, err, ErrStoreUnavailable)
	assert.Equal(t, 1.0, gatherValue(t, reg, "quotient_limiter_pipeline_shed_total", nil))
	start := time.Now()
	d, err := l.Check(context.Background(), Request{Identity: Identity{APIKey: "shed"}})
	require.NoError(t, err)
	assert.Equal(t, SourceFallback, d.Source)
	assert.Less(t, time.Since(start), 5*time.Second, "answered without waiting for the 10 s deadline")
	assert.Equal(t, 2.0, gatherValue(t, reg, "quotient_limiter_pipeline_shed_total", nil))
	assert.Equal(t, 0.0, gatherValue(t, reg, "quotient_limiter_refund_failures_total", nil))
}
