package rls

import (
	"context"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotientlabs/quotient/limiter"
)

// FuzzShouldRateLimit sends arbitrary wire-format requests to the server
// (in-memory store): every answer is InvalidArgument or a response with one
// status per descriptor whose overall code is OVER_LIMIT exactly when a
// status is.
func FuzzShouldRateLimit(f *testing.F) {
	cfg, err := LoadDir("testdata/corpus", ParseOptions{})
	if err != nil {
		f.Fatal(err)
	}
	l, err := limiter.New(limiter.DefaultConfig(), nil)
	if err != nil {
		f.Fatal(err)
	}
	srv, err := NewServer(ServerConfig{Limiter: l, Config: cfg, ResponseHeaders: true})
	if err != nil {
		f.Fatal(err)
	}
	seed := func(r *rlsv3.RateLimitRequest) {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	seed(&rlsv3.RateLimitRequest{Domain: "sms", Descriptors: []*ratelimitv3.RateLimitDescriptor{d("kind", "promo", "phone", "1"), d("phone", "1")}})
	seed(&rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 3, Descriptors: []*ratelimitv3.RateLimitDescriptor{d("client_ip", "192.0.2.66"), d("health", "x")}})
	o := d("a", "b")
	o.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_HOUR, UnitMultiplier: wrapperspb.UInt32(3)}
	o.HitsAddend = wrapperspb.UInt64(0)
	seed(&rlsv3.RateLimitRequest{Domain: "soft", Descriptors: []*ratelimitv3.RateLimitDescriptor{o, d("team", "red", "login", "alice"), d("team", "blue", "login", "alice"), d("path", "/shared/x")}})
	f.Fuzz(func(t *testing.T, data []byte) {
		var req rlsv3.RateLimitRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		resp, err := srv.ShouldRateLimit(context.Background(), &req)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error %v, want InvalidArgument", err)
			}
			return
		}
		if len(resp.Statuses) != len(req.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
		}
		over := false
		for _, s := range resp.Statuses {
			over = over || s.Code == rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if over != (resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT) {
			t.Fatalf("overall %v with statuses %v", resp.OverallCode, resp.Statuses)
		}
	})
}
