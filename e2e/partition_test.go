package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/netlab"
	"github.com/quotientlabs/quotient/limiter"
)

// TestBinariesRegionCutOff runs each region as its own host (a network
// namespace with its redis-server, quotient coordinator and quotient
// gateway) and the broker on a host of its own, then cuts one region off
// from every other host with nftables for 40 s (its gateway keeps serving
// its clients) and heals it. The partition rule must keep the enforced sum
// within the global limit at every 100 ms sample; the test reports the
// over-admission and the under-service of each 60 s window.
func TestBinariesRegionCutOff(t *testing.T) {
	t.Parallel() // after the main run, beside the other short deployment
	if err := netlab.Available(); err != nil {
		t.Skipf("this machine lacks what network namespaces need: %v", err)
	}
	const (
		rate    = 30.0
		cutFrom = 25 * time.Second
		cutTo   = 65 * time.Second
		runTo   = 100 * time.Second
		port    = 6379
	)
	dir := t.TempDir()
	quotient, devkafka := bin(t, "quotient"), bin(t, "devkafka")
	lab := netlab.New(t)
	brokerHost := lab.AddHost("broker")
	broker := startCmd(t, dir, "devkafka", brokerHost.Command(context.Background(), devkafka, "--listen", brokerHost.Addr(9092)))
	kafka := broker.waitLog(t, regexpFor(brokerHost.Addr(9092)), 20*time.Second)

	policies := filepath.Join(dir, "policies.json")
	require.NoError(t, os.WriteFile(policies, []byte(fmt.Sprintf(`[{"id":"g","algorithm":"token_bucket","rate_per_sec":%v,"burst":%v,"scope":"global"}]`, rate, rate)), 0o600))
	keys := filepath.Join(dir, "keys.json")
	require.NoError(t, os.WriteFile(keys, []byte(`{"k":{"tier":"pro"}}`), 0o600))

	// The upstream runs in the test process (root namespace): the hosts
	// reach it on the lab's bridge address.
	upURL := upstreamOn(t, lab.Gateway()+":0")
	hosts := map[string]*netlab.Host{}
	clients := map[string]*redis.Client{}
	gw := map[string]string{}
	for _, name := range regions {
		h := lab.AddHost(name)
		hosts[name] = h
		startCmd(t, dir, "redis-"+name, h.Command(context.Background(), "redis-server", "--bind", h.IP, "--port", strconv.Itoa(port), "--save", "", "--appendonly", "no", "--protected-mode", "no"))
		c := redis.NewClient(&redis.Options{Addr: h.Addr(port)})
		t.Cleanup(func() { _ = c.Close() })
		clients[name] = c
		startCmd(t, dir, "coordinator-"+name, h.Command(context.Background(), quotient, "coordinator",
			"--region", name, "--regions", strings.Join(regions, ","), "--redis", h.Addr(port), "--kafka", kafka,
			"--listen", h.Addr(9090), "--epoch", epoch.String(), "--policies", policies))
		g := startCmd(t, dir, "gateway-"+name, h.Command(context.Background(), quotient, "gateway",
			"--listen", h.Addr(8080), "--upstream", upURL, "--redis", h.Addr(port), "--region", name, "--regions", strings.Join(regions, ","),
			"--epoch", epoch.String(), "--usage-flush", usageFlush.String(), "--policies", policies, "--keys", keys))
		g.waitLog(t, regexpFor("listening on "+h.Addr(8080)), 30*time.Second)
		gw[name] = "http://" + h.Addr(8080)
	}
	for _, name := range regions {
		waitHTTP(t, "http://"+hosts[name].Addr(9090)+"/readyz", 60*time.Second, nil)
		waitHTTP(t, gw[name]+"/readyz", 30*time.Second, nil) // warm: no request is decided before
	}

	cut := hosts["ap-south"]
	t0 := time.Now().Add(200 * time.Millisecond)
	var samples, violations atomic.Int64
	var first atomic.Value
	sctx, stop := context.WithCancel(context.Background())
	var sampler sync.WaitGroup
	sampler.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		key := limiter.ShareKey(limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "k"}, "g")
		for {
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
			var sum int64
			var parts []string
			complete := true
			for _, name := range regions {
				ctx, cancel := context.WithTimeout(sctx, time.Second)
				m, err := clients[name].HGetAll(ctx, key).Result()
				cancel()
				if err != nil {
					complete = false
					break
				}
				r := int64(rate*1000) / int64(len(regions))
				if v, err := strconv.ParseInt(m["r"], 10, 64); err == nil {
					r = v
				}
				sum += r
				parts = append(parts, fmt.Sprintf("%s=%d", name, r))
			}
			if !complete {
				continue
			}
			samples.Add(1)
			if sum > int64(rate*1000) && violations.Add(1) == 1 {
				first.Store(fmt.Sprintf("at %v: %d > %d (%s)", time.Since(t0).Round(100*time.Millisecond), sum, int64(rate*1000), strings.Join(parts, ", ")))
			}
		}
	})
	out := newOutcome(runTo)
	var wg sync.WaitGroup
	sendFlows(t0, []flow{
		{"k", "/x", "us-east", 35, 0, runTo},
		{"k", "/x", "eu-west", 5, 0, runTo},
		{"k", "/x", "ap-south", 20, 0, runTo},
	}, gw, out, &wg)
	wg.Go(func() {
		time.Sleep(time.Until(t0.Add(cutFrom))) // the schedule
		cut.Cut(brokerHost, hosts["us-east"], hosts["eu-west"])
		time.Sleep(time.Until(t0.Add(cutTo))) // the schedule
		cut.Heal()
	})
	wg.Wait()
	stop()
	sampler.Wait()

	assert.Positive(t, samples.Load())
	assert.Zero(t, violations.Load(), "Σ shares > L in %d of %d samples; first %v", violations.Load(), samples.Load(), first.Load())
	ideal := idealBucket(out.demand["k"], func(int) float64 { return rate }, func(int) float64 { return rate })
	for _, w := range [][2]int{{20, 80}, {40, 100}} {
		var adm, id float64
		for s := w[0]; s < w[1]; s++ {
			adm += float64(out.admitted["k"][s])
			id += ideal[s]
		}
		e := (adm - id) / (rate * float64(w[1]-w[0]))
		t.Logf("cut off %v-%v: window [%ds, %ds): admitted %.0f ideal %.0f error %+.1f%%", cutFrom, cutTo, w[0], w[1], adm, id, 100*e)
		assert.LessOrEqual(t, e, 0.05, "over-admission beyond 5%% in window [%ds, %ds)", w[0], w[1])
	}
	t.Logf("per region admitted: us-east %d eu-west %d ap-south %d", out.perReg["k/us-east"], out.perReg["k/eu-west"], out.perReg["k/ap-south"])
}
