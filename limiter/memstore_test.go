package limiter

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMemoryStoreCheckAllocatesNothing holds the in-process decision path
// to zero allocations once the subjects' states exist (issue 16: the
// memory store at 2 M decisions/s on one core): one subject with two
// policies, and two subjects of one request, with every decision sampled
// for events to the default sink, whose discard logger must not cost an
// event. testing.AllocsPerRun counts mallocs, which the race detector does
// not add to, so the test holds under -race too.
func TestMemoryStoreCheckAllocatesNothing(t *testing.T) {
	ps, err := ParsePolicies([]byte(`[
		{"id":"burst","algorithm":"token_bucket","rate_per_sec":1000,"burst":2000},
		{"id":"daily","algorithm":"fixed_window","limit":100000000,"window_s":86400},
		{"id":"acct","subject":"account","algorithm":"leaky_bucket","rate_per_sec":1000,"burst":2000}
	]`))
	require.NoError(t, err)
	l, err := New(Config{EventSampleRate: 1}, ps)
	require.NoError(t, err)
	ctx := context.Background()
	const keys = 64
	reqs := make([]Request, keys)
	for i := range reqs {
		reqs[i] = Request{Identity: Identity{APIKey: fmt.Sprintf("key-%d", i), Account: fmt.Sprintf("acct-%d", i%8)}, Method: "GET", Path: "/v1/x"}
	}
	now := time.Unix(1_800_000_000, 0)
	var d Decision
	for i := range reqs { // the states exist from here on
		require.NoError(t, l.CheckInto(ctx, now, reqs[i], &d))
	}
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Millisecond)
		if err := l.CheckInto(ctx, now, reqs[i%keys], &d); err != nil {
			panic(err)
		}
		i++
	})
	assert.Zero(t, allocs, "allocations per decision")
	require.True(t, d.Allowed)
	require.Len(t, d.Policies, 3, "the two policies of the key and the account's")
	assert.Equal(t, Subject{Kind: SubjectAccount, Value: reqs[(i-1)%keys].Identity.Account}, d.Policies[2].Subject)
}

// TestMemoryStoreKindsApart: subjects of different kinds with one value
// have separate states (the store keys its maps by value per kind), and
// the sweep drops the state and then the kind once expired, so memory
// follows active keys.
func TestMemoryStoreKindsApart(t *testing.T) {
	key := mustPolicy(t, `{"id":"p","algorithm":"fixed_window","limit":2,"window_s":1}`)
	acct := mustPolicy(t, `{"id":"p","subject":"account","algorithm":"fixed_window","limit":2,"window_s":1}`)
	store := NewMemoryStore()
	l, err := New(Config{Store: store}, []*Policy{key})
	require.NoError(t, err)
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	k, a := Subject{Kind: SubjectAPIKey, Value: "x"}, Subject{Kind: SubjectAccount, Value: "x"}
	for range 2 {
		d, err := l.checkSubjectAt(ctx, now, k, []*Policy{key}, 1)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	d, err := l.checkSubjectAt(ctx, now, k, []*Policy{key}, 1)
	require.NoError(t, err)
	assert.False(t, d.Allowed, "the key's window is full")
	d, err = l.checkSubjectAt(ctx, now, a, []*Policy{acct}, 1)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "the account with the same value counts on its own")
	assert.Equal(t, int64(1), d.Policies[0].Remaining)
	assert.Equal(t, 2, store.Len())
	sh := store.shard(k)
	require.Same(t, sh, store.shard(a), "one value, one shard")
	assert.Len(t, sh.kinds, 2)

	// Past the windows' expiry (window end + 1 s) and the sweep interval:
	// the next decision's sweep drops both states and both kinds.
	later := now.Add(sweepEveryMs*time.Millisecond + 3*time.Second)
	_, err = l.checkSubjectAt(ctx, later, k, []*Policy{key}, 0)
	require.NoError(t, err)
	assert.Equal(t, 0, store.Len())
	assert.Empty(t, sh.kinds)
}

// TestMemoryShardIsOneCacheLine: the padding of memShard keeps one shard
// per 64-byte line (a field added to it must shrink the padding).
func TestMemoryShardIsOneCacheLine(t *testing.T) {
	assert.Equal(t, uintptr(64), unsafe.Sizeof(memShard{}))
	assert.Zero(t, unsafe.Offsetof(MemoryStore{}.shards))
	// The sizes MemoryStore's doc states (176 bytes: Go's size class).
	assert.Equal(t, uintptr(168), unsafe.Sizeof(memSubject{}))
	assert.Equal(t, uintptr(120), unsafe.Sizeof(memEntry{}))
}

// TestMemoryStoreConcurrentIsExact: goroutines deciding at once on shared
// subjects (keys on many shards, one account over all of them) admit
// exactly what one caller would, all or nothing across key and account:
// the shard locks make every decision atomic (run it with -race).
func TestMemoryStoreConcurrentIsExact(t *testing.T) {
	const goroutines, perG, keys, burst, limit = 8, 200, 16, 20, 250
	ps, err := ParsePolicies([]byte(fmt.Sprintf(`[
		{"id":"burst","algorithm":"token_bucket","rate_per_sec":0.001,"burst":%d},
		{"id":"acct","subject":"account","algorithm":"fixed_window","limit":%d,"window_s":3600}]`, burst, limit)))
	require.NoError(t, err)
	l, err := New(Config{}, ps)
	require.NoError(t, err)
	now := time.Unix(1_800_000_000, 0)
	admitted := make([]int, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d Decision
			for i := range perG {
				req := Request{Identity: Identity{APIKey: fmt.Sprintf("k%d", (g+i)%keys), Account: "acme"}}
				if err := l.CheckInto(context.Background(), now, req, &d); err != nil {
					panic(err)
				}
				if d.Allowed {
					admitted[g]++
				}
			}
		}()
	}
	wg.Wait()
	total := 0
	for _, n := range admitted {
		total += n
	}
	// 16 keys x 20 tokens = 320 key admissions, capped by the account's
	// 250; no time passes, so nothing refills.
	assert.Equal(t, limit, total)
	d, err := l.CheckAt(context.Background(), now, Request{Identity: Identity{APIKey: "k0", Account: "acme"}})
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	assert.Equal(t, int64(0), d.Policies[1].Remaining, "the account's window is spent")
}
