package limiter

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

// expirySlack is how much longer than it needs a key may live (script.lua:
// 2 * SLACK), so that most writes keep the key's expiry (SET ... KEEPTTL)
// instead of writing a new one.
const expirySlack = 2000 * time.Millisecond

// TestScriptExpiry checks the expiry rule of script.lua against a real
// redis-server's PTTL, standalone and cluster, for every algorithm: after
// every admitted write the key's TTL is at least what a write of exactly
// reset + 1 s makes (the expiry every earlier release wrote, so no key
// expires earlier than it did), less the time the call and the PTTL took,
// and at most that plus expirySlack, so every key still expires. A window
// that grows between writes (same key, a longer window_s) moves the
// expiry out at once; the writes of one long window keep the first
// write's expiry (the TTL only falls), which is the write the rule saves.
func TestScriptExpiry(t *testing.T) {
	servers := map[string]func(t *testing.T) redis.UniversalClient{
		"standalone": func(t *testing.T) redis.UniversalClient { return redistest.StartServer(t).Client() },
		"cluster":    func(t *testing.T) redis.UniversalClient { return redistest.StartCluster(t).Client() },
	}
	docs := []string{
		`{"id":"tb","algorithm":"token_bucket","rate_per_sec":5,"burst":30}`,
		`{"id":"lb","algorithm":"leaky_bucket","rate_per_sec":50,"burst":100}`,
		`{"id":"fw","algorithm":"fixed_window","limit":1000,"window_s":%d}`,
		`{"id":"fm","algorithm":"fixed_window","limit":1000,"window":"month"}`,
		`{"id":"fg","algorithm":"fixed_window","limit":1000,"window_s":%d,"scope":"global"}`,
		`{"id":"sl","algorithm":"sliding_window_log","limit":1000,"window_s":%d}`,
		`{"id":"sc","algorithm":"sliding_window_counter","limit":1000,"window_s":%d}`,
	}
	for name, start := range servers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			client := start(t)
			ctx := context.Background()
			for _, doc := range docs {
				short := windowPolicy(t, doc, 2)
				t.Run(short.ID, func(t *testing.T) {
					l, err := New(Config{Store: NewRedisStore(client), Regions: 3, Region: "us-east"}, []*Policy{short})
					require.NoError(t, err)
					subj := Subject{Kind: SubjectAPIKey, Value: "expiry-" + name + "-" + short.ID}
					key := StateKey(subj, short)
					// write admits one request under p and returns the key's
					// TTL after it, checked against the rule, and the reset.
					write := func(p *Policy) (ttl, reset time.Duration) {
						t.Helper()
						before := time.Now()
						d, err := l.checkSubjectAt(ctx, before, subj, []*Policy{p}, 1)
						require.NoError(t, err)
						require.True(t, d.Allowed)
						require.Len(t, d.Policies, 1)
						ttl, err = client.PTTL(ctx, key).Result()
						require.NoError(t, err)
						took := time.Since(before)
						need := d.Policies[0].ResetAfter + time.Second
						// PTTL rounds to the ms: 1 ms either way.
						assert.GreaterOrEqual(t, ttl, need-took-time.Millisecond, "never earlier than PX reset + 1 s")
						assert.LessOrEqual(t, ttl, need+expirySlack+time.Millisecond, "at most the slack later")
						return ttl, d.Policies[0].ResetAfter
					}
					for range 20 {
						write(short)
					}
					if short.WindowSec == 0 && short.Window == "" {
						return // buckets: no window to grow
					}
					// Same ID, same key, a window of an hour (a month stays a
					// month: its expiry does not move within the month). The
					// first write checks that the expiry moves out at once
					// (write's lower bound holds with the hour's reset).
					long := windowPolicy(t, doc, 3600)
					prev, prevReset := write(long)
					p0 := pexpireCalls(t, client)
					for range 20 {
						ttl, reset := write(long)
						if long.Algorithm == FixedWindow && reset <= prevReset {
							// The needed expiry is the window's end: kept
							// (unless the window just rolled: its reset grew).
							assert.LessOrEqual(t, ttl, prev, "the expiry was kept, not written again")
						}
						prev, prevReset = ttl, reset
					}
					if p0 >= 0 && (long.Algorithm == SlidingWindowLog || long.Scope == ScopeGlobal) {
						// These write their expiry with PEXPIRE, so Redis counts
						// the writes the rule saves: 20 without it. A sliding
						// log's needed expiry moves with the clock, so a slow
						// machine may write it again after a second.
						assert.LessOrEqual(t, pexpireCalls(t, client)-p0, int64(5), "most writes keep the expiry")
					}
				})
			}
		})
	}
}

// windowPolicy is the policy doc with its window (%d, if it has one) set
// to windowSec.
func windowPolicy(t *testing.T, doc string, windowSec int) *Policy {
	t.Helper()
	if strings.Contains(doc, "%d") {
		doc = fmt.Sprintf(doc, windowSec)
	}
	return mustPolicy(t, doc)
}

// pexpireCalls is the number of PEXPIRE calls a standalone server has
// served (INFO commandstats), -1 on a cluster.
func pexpireCalls(t *testing.T, client redis.UniversalClient) int64 {
	t.Helper()
	c, ok := client.(*redis.Client)
	if !ok {
		return -1
	}
	info, err := c.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_pexpire:calls="); ok {
			n, err := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	return 0
}
