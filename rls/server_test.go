package rls

import (
	"context"
	"math"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
)

const (
	OK   = rlsv3.RateLimitResponse_OK
	OVER = rlsv3.RateLimitResponse_OVER_LIMIT
)

type harness struct {
	client rlsv3.RateLimitServiceClient
	srv    *Server
	l      *limiter.Limiter
}

// startRLS serves cfg on a loopback port with a limiter on rc and returns a
// real gRPC client.
func startRLS(t *testing.T, rc redis.UniversalClient, cfg *Config, deadline time.Duration, headers bool) *harness {
	t.Helper()
	lcfg := limiter.DefaultConfig()
	store := limiter.NewRedisStore(rc)
	// Warm the store (connections, scripts, the cluster's slots) before
	// the first call, as a server that reports ready does: cold, the first
	// call's dial and script load on a three-node cluster passed a 50 ms
	// deadline under CI's load and was answered by the fallback.
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err := store.Warm(wctx, limiter.DefaultWarmConfig())
	wcancel()
	require.NoError(t, err)
	lcfg.Store = store
	lcfg.Deadline = deadline
	lcfg.EventSampleRate = -1
	l, err := limiter.New(lcfg, nil)
	require.NoError(t, err)
	srv, err := NewServer(ServerConfig{Limiter: l, Config: cfg, ResponseHeaders: headers})
	require.NoError(t, err)
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return &harness{client: rlsv3.NewRateLimitServiceClient(conn), srv: srv, l: l}
}

func d(kv ...string) *ratelimitv3.RateLimitDescriptor {
	out := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		out.Entries = append(out.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func (h *harness) call(t *testing.T, domain string, descs ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	return h.callReq(t, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: descs})
}

func (h *harness) callReq(t *testing.T, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := h.client.ShouldRateLimit(ctx, req)
	require.NoError(t, err)
	require.Len(t, resp.Statuses, len(req.Descriptors))
	return resp
}

// codes lists the statuses' codes and remaining counts, "OK/3".
func summary(resp *rlsv3.RateLimitResponse) []string {
	var out []string
	for _, s := range resp.Statuses {
		code := "OK"
		if s.Code == OVER {
			code = "OVER"
		}
		out = append(out, code+"/"+itoa(int64(s.LimitRemaining)))
	}
	return out
}

func itoa(v int64) string {
	if v == math.MaxUint32 {
		return "max"
	}
	return strconv.FormatInt(v, 10)
}

type backend struct {
	name   string
	client func(t *testing.T) redis.UniversalClient
}

var backends = []backend{
	{"standalone", func(t *testing.T) redis.UniversalClient { return redistest.StartServer(t).Client() }},
	{"cluster", func(t *testing.T) redis.UniversalClient { return redistest.StartCluster(t).Client() }},
}

func TestServerCorpus(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			h := startRLS(t, b.client(t), loadCorpus(t), 2*time.Second, false)

			t.Run("nested and key-only rules, all or nothing", func(t *testing.T) {
				promo, phone := d("kind", "promo", "phone", "555"), d("phone", "555")
				assert.Equal(t, []string{"OK/1", "OK/3"}, summary(h.call(t, "sms", promo, phone)))
				assert.Equal(t, []string{"OK/0", "OK/2"}, summary(h.call(t, "sms", promo, phone)))
				resp := h.call(t, "sms", promo, phone)
				assert.Equal(t, OVER, resp.OverallCode)
				assert.Equal(t, OVER, resp.Statuses[0].Code)
				assert.Equal(t, uint32(2), resp.Statuses[0].CurrentLimit.RequestsPerUnit)
				assert.Equal(t, rlsv3.RateLimitResponse_RateLimit_DAY, resp.Statuses[0].CurrentLimit.Unit)
				// The rejected request took nothing from the phone's limit.
				assert.Equal(t, []string{"OK/1"}, summary(h.call(t, "sms", phone)))
				assert.Equal(t, []string{"OK/0"}, summary(h.call(t, "sms", phone)))
				assert.Equal(t, []string{"OVER/0"}, summary(h.call(t, "sms", phone)))
				// Another number has its own counters.
				assert.Equal(t, []string{"OK/3"}, summary(h.call(t, "sms", d("phone", "556"))))
			})

			t.Run("zero per unit is always over and consumes nothing", func(t *testing.T) {
				resp := h.call(t, "edge", d("client_ip", "192.0.2.66"), d("client_ip", "192.0.2.7"), d("health", "x"))
				assert.Equal(t, OVER, resp.OverallCode)
				assert.Equal(t, []string{"OVER/0", "OK/5", "OK/max"}, summary(resp), "the other address is only peeked")
				assert.Equal(t, uint32(0), resp.Statuses[0].CurrentLimit.RequestsPerUnit)
				assert.Positive(t, resp.Statuses[0].DurationUntilReset.AsDuration())
				assert.Nil(t, resp.Statuses[2].CurrentLimit, "unlimited has no limit")
				assert.Equal(t, []string{"OK/4"}, summary(h.call(t, "edge", d("client_ip", "192.0.2.7"))))
			})

			t.Run("no rule, wrong depth, unknown domain: OK without a limit", func(t *testing.T) {
				resp := h.call(t, "edge", d("route", "deep"), d("nothing", "here"))
				assert.Equal(t, OK, resp.OverallCode)
				for _, s := range resp.Statuses {
					assert.Nil(t, s.CurrentLimit)
				}
				assert.Equal(t, OK, h.call(t, "no-such-domain", d("a", "b")).OverallCode)
			})

			t.Run("replaces drops the replaced limit", func(t *testing.T) {
				red, blue := d("team", "red", "login", "alice"), d("team", "blue", "login", "alice")
				for i := range 4 {
					resp := h.call(t, "soft", red, blue)
					assert.Equal(t, OK, resp.OverallCode, "request %d", i)
					assert.Nil(t, resp.Statuses[0].CurrentLimit, "replaced")
					assert.Equal(t, uint32(3-i), resp.Statuses[1].LimitRemaining)
				}
				assert.Equal(t, OVER, h.call(t, "soft", red, blue).OverallCode)
				// The replaced limit was never charged.
				assert.Equal(t, []string{"OK/1"}, summary(h.call(t, "soft", red)))
			})

			t.Run("shadow mode never rejects", func(t *testing.T) {
				trial := d("app", "x", "tenant", "trial")
				for range 3 {
					resp := h.call(t, "soft", trial)
					assert.Equal(t, OK, resp.OverallCode)
					assert.Equal(t, uint32(1), resp.Statuses[0].CurrentLimit.RequestsPerUnit)
				}
			})

			t.Run("wildcards count per value, share_threshold together", func(t *testing.T) {
				assert.Equal(t, []string{"OK/1", "OK/1"}, summary(h.call(t, "soft", d("path", "/api/a"), d("path", "/api/b"))))
				assert.Equal(t, []string{"OK/0", "OK/0"}, summary(h.call(t, "soft", d("path", "/api/a"), d("path", "/api/b"))))
				assert.Equal(t, []string{"OK/1"}, summary(h.call(t, "soft", d("path", "/shared/a"))))
				assert.Equal(t, []string{"OK/0"}, summary(h.call(t, "soft", d("path", "/shared/b"))))
				assert.Equal(t, []string{"OVER/0"}, summary(h.call(t, "soft", d("path", "/shared/c"))))
			})

			t.Run("hits_addend of the request and of a descriptor, 0 peeks", func(t *testing.T) {
				sku := d("sku", "h1")
				assert.Equal(t, []string{"OK/1"}, summary(h.callReq(t, &rlsv3.RateLimitRequest{Domain: "soft", HitsAddend: 2, Descriptors: []*ratelimitv3.RateLimitDescriptor{sku}})))
				peek := d("sku", "h1")
				peek.HitsAddend = wrapperspb.UInt64(0)
				assert.Equal(t, []string{"OK/1"}, summary(h.call(t, "soft", peek)))
				two := d("sku", "h1")
				two.HitsAddend = wrapperspb.UInt64(2)
				assert.Equal(t, []string{"OVER/1"}, summary(h.call(t, "soft", two)), "a rejected hit is not counted")
				assert.Equal(t, []string{"OK/0"}, summary(h.call(t, "soft", d("sku", "h1"))))
				// A repeated descriptor adds its hits to one counter.
				assert.Equal(t, []string{"OK/1", "OK/1"}, summary(h.call(t, "soft", d("sku", "h2"), d("sku", "h2"))))
				// Different hits are decided one cost at a time, in request
				// order: a rejection leaves what came before consumed and
				// only peeks what comes after.
				big := func(v string) *ratelimitv3.RateLimitDescriptor {
					x := d("sku", v)
					x.HitsAddend = wrapperspb.UInt64(5)
					return x
				}
				resp := h.call(t, "soft", d("sku", "m1"), big("m2"))
				assert.Equal(t, OVER, resp.OverallCode)
				assert.Equal(t, []string{"OK/2", "OVER/3"}, summary(resp))
				resp = h.call(t, "soft", big("m3"), d("sku", "m4"))
				assert.Equal(t, []string{"OVER/3", "OK/3"}, summary(resp), "m4 only peeked")
				assert.Equal(t, []string{"OK/2"}, summary(h.call(t, "soft", d("sku", "m4"))))
			})

			t.Run("limit override", func(t *testing.T) {
				o := d("any", "thing")
				o.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_DAY}
				resp := h.call(t, "soft", o)
				assert.Equal(t, []string{"OK/0"}, summary(resp))
				assert.Equal(t, uint32(1), resp.Statuses[0].CurrentLimit.RequestsPerUnit)
				assert.Equal(t, []string{"OVER/0"}, summary(h.call(t, "soft", o)))
				// Another limit for the same descriptor is its own limit:
				// the rejection under 1 per day does not carry over.
				o5 := d("any", "thing")
				o5.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_DAY}
				assert.Equal(t, []string{"OK/4"}, summary(h.call(t, "soft", o5)))
			})
		})
	}
}

func TestServerHeaders(t *testing.T) {
	h := startRLS(t, redistest.StartServer(t).Client(), loadCorpus(t), 2*time.Second, true)
	hdr := func(resp *rlsv3.RateLimitResponse) map[string]string {
		m := map[string]string{}
		for _, hv := range resp.ResponseHeadersToAdd {
			m[hv.Key] = hv.Value
		}
		return m
	}
	ok := hdr(h.call(t, "sms", d("phone", "777")))
	assert.Equal(t, `"sms.phone";q=4;w=86400`, ok["RateLimit-Policy"])
	assert.Regexp(t, `^"sms.phone";r=3;t=\d+$`, ok["RateLimit"])
	assert.NotContains(t, ok, "Retry-After")

	over := hdr(h.call(t, "edge", d("client_ip", "192.0.2.66")))
	assert.Regexp(t, `^\d+$`, over["Retry-After"])

	shadow := hdr(h.call(t, "soft", d("app", "x", "tenant", "trial")))
	assert.NotContains(t, shadow, "RateLimit-Policy", "shadow limits are not exposed")
}

func TestMalformedRequestsConsumeNothing(t *testing.T) {
	h := startRLS(t, redistest.StartServer(t).Client(), loadCorpus(t), 2*time.Second, false)
	valid := func() *ratelimitv3.RateLimitDescriptor { return d("phone", "888") }
	neg := valid()
	neg.IsNegativeHits = true
	huge := valid()
	huge.HitsAddend = wrapperspb.UInt64(1 << 40)
	badUnit := valid()
	badUnit.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_UNKNOWN}
	many := make([]*ratelimitv3.RateLimitDescriptor, MaxDescriptors+1)
	for i := range many {
		many[i] = valid()
	}
	wide := valid()
	for range 5 {
		wide.Entries = append(wide.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "k", Value: strings.Repeat("v", MaxEntryBytes)})
	}
	deep := valid()
	for range MaxEntries {
		deep.Entries = append(deep.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "k", Value: "v"})
	}
	cases := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		msg  string
	}{
		{"empty domain", &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{valid()}}, "domain is empty"},
		{"huge domain", &rlsv3.RateLimitRequest{Domain: strings.Repeat("d", MaxDomainBytes+1), Descriptors: []*ratelimitv3.RateLimitDescriptor{valid()}}, "domain is 257 bytes"},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "sms"}, "no descriptors"},
		{"too many descriptors", &rlsv3.RateLimitRequest{Domain: "sms", Descriptors: many}, "65 descriptors"},
		{"no entries", &rlsv3.RateLimitRequest{Domain: "sms", Descriptors: []*ratelimitv3.RateLimitDescriptor{valid(), {}}}, "descriptors[1] has no entries"},
		{"too many entries", &rlsv3.RateLimitRequest{Domain: "sms", Descriptors: []*ratelimitv3.RateLimitDescriptor{deep}}, "17 entries"},
		{"empty key", &rlsv3.RateLimitRequest{Domain: "sms", Descriptors: []*ratelimitv3.RateLimitDescriptor{valid(), d("", "x")}}, "descriptors[1].entries[0].key is empty"},
		{"huge value", &rlsv3.RateLimitRequest{Domain: "sms", Descriptors: []*ratelimitv3.RateLimitDescriptor{valid(), d("phone", strings.Repeat("9", MaxEntryBytes+1))}}, "value is 1025 bytes"},
		{"huge descriptor", &rlsv3.RateLimitRequest{Domain: "sms", Descriptors: []*ratelimitv3.RateLimitDescriptor{valid(), wide}}, "descriptors[1]: keys and values are 5133 bytes together, more than 4096"},
		{"huge request hits", &rlsv3.RateLimitRequest{Domain: "sms", HitsAddend: 1 << 31, Descriptors: []*ratelimitv3.RateLimitDescriptor{valid()}}, "hits_addend 2147483648"},
		{"huge descriptor hits", &rlsv3.RateLimitRequest{Domain: "sms", Descriptors: []*ratelimitv3.RateLimitDescriptor{valid(), huge}}, "descriptors[1].hits_addend"},
		{"negative hits", &rlsv3.RateLimitRequest{Domain: "sms", Descriptors: []*ratelimitv3.RateLimitDescriptor{valid(), neg}}, "is_negative_hits is not supported"},
		{"override unit", &rlsv3.RateLimitRequest{Domain: "sms", Descriptors: []*ratelimitv3.RateLimitDescriptor{valid(), badUnit}}, "descriptors[1].limit: unit UNKNOWN"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.client.ShouldRateLimit(context.Background(), tc.req)
			require.Error(t, err)
			assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
			assert.Contains(t, status.Convert(err).Message(), tc.msg)
		})
	}
	// Nothing was consumed by any of them: the number's whole limit is left.
	assert.Equal(t, []string{"OK/3"}, summary(h.call(t, "sms", valid())))
}

func TestRedisKilledMidStream(t *testing.T) {
	type killable struct {
		name  string
		start func(t *testing.T) (redis.UniversalClient, func())
	}
	for _, k := range []killable{
		{"standalone", func(t *testing.T) (redis.UniversalClient, func()) {
			rs := redistest.StartServer(t)
			return rs.Client(), rs.Kill
		}},
		{"cluster", func(t *testing.T) (redis.UniversalClient, func()) {
			c := redistest.StartCluster(t)
			return c.Client(), func() {
				for _, n := range c.Nodes() {
					n.Kill()
				}
			}
		}},
	} {
		t.Run(k.name, func(t *testing.T) {
			rc, kill := k.start(t)
			const deadline = 50 * time.Millisecond
			h := startRLS(t, rc, loadCorpus(t), deadline, false)
			ip := d("client_ip", "198.51.100.1")
			assert.Equal(t, []string{"OK/4"}, summary(h.call(t, "edge", ip)))

			kill()
			// Every answer comes from the fallback (quota: fail open onto an
			// in-process limit), within the deadline plus scheduling; none
			// hangs.
			for i := range 20 {
				start := time.Now()
				resp := h.call(t, "edge", ip, d("batch", strconv.Itoa(i)))
				assert.Less(t, time.Since(start), 2*time.Second, "request %d", i)
				assert.NotNil(t, resp.Statuses[0].CurrentLimit)
				assert.Equal(t, OK, resp.Statuses[1].Code, "a fresh descriptor is admitted by the fallback")
			}
			// The fail-open limit still limits.
			var oks int
			for range 20 {
				if h.call(t, "edge", ip).OverallCode == OK {
					oks++
				}
			}
			assert.Less(t, oks, 20, "the in-process fallback limits too")
			assert.Equal(t, limiter.BreakerOpen, h.l.BreakerState())
		})
	}
}
