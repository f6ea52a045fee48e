package rls

import (
	"path/filepath"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// The Envoy Gateway example: its EnvoyPatchPolicy's three patches decode
// into Envoy's v3 types (the filter, the route's rate limits, the cluster)
// and validate; the filter names the cluster the policy adds, its domain
// is the Istio example's configuration's, and the actions are the Istio
// example's, which that test checks against the configuration's rules.
func TestExampleEnvoyGateway(t *testing.T) {
	var rl ratelimitfilterv3.RateLimit
	var cluster clusterv3.Cluster
	var actions []*routev3.RateLimit
	kinds := map[string]int{}
	for _, doc := range yamlDocs(t, filepath.Join("..", "examples", "envoy-gateway", "envoypatchpolicy.yaml")) {
		kinds[doc["kind"].(string)]++
		if doc["kind"] != "EnvoyPatchPolicy" {
			continue
		}
		assert.Equal(t, "JSONPatch", dig(doc, "spec", "type"))
		for _, p := range dig(doc, "spec", "jsonPatches").([]any) {
			assert.Equal(t, "add", dig(p, "operation", "op"))
			value := dig(p, "operation", "value")
			switch dig(p, "type") {
			case "type.googleapis.com/envoy.config.listener.v3.Listener":
				assert.Equal(t, "default/eg/http", dig(p, "name"))
				assert.Equal(t, "envoy.filters.http.ratelimit", dig(value, "name"))
				var a anypb.Any
				require.NoError(t, protojson.Unmarshal(toJSON(t, dig(value, "typed_config")), &a))
				require.NoError(t, a.UnmarshalTo(&rl))
				require.NoError(t, rl.ValidateAll())
			case "type.googleapis.com/envoy.config.route.v3.RouteConfiguration":
				assert.Equal(t, "/virtual_hosts/0/rate_limits", dig(p, "operation", "path"))
				for _, v := range value.([]any) {
					var r routev3.RateLimit
					require.NoError(t, protojson.Unmarshal(toJSON(t, v), &r))
					require.NoError(t, r.ValidateAll())
					actions = append(actions, &r)
				}
			case "type.googleapis.com/envoy.config.cluster.v3.Cluster":
				require.NoError(t, protojson.Unmarshal(toJSON(t, value), &cluster))
				require.NoError(t, cluster.ValidateAll())
				assert.Equal(t, cluster.GetName(), dig(p, "name"))
			default:
				t.Fatalf("unexpected patch of %v", dig(p, "type"))
			}
		}
	}
	assert.Equal(t, map[string]int{"ConfigMap": 1, "EnvoyPatchPolicy": 1}, kinds)
	assert.Equal(t, "mesh", rl.GetDomain())
	assert.Equal(t, cluster.GetName(), rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName())
	require.Len(t, cluster.GetHealthChecks(), 1)
	assert.Equal(t, "envoy.service.ratelimit.v3.RateLimitService", cluster.GetHealthChecks()[0].GetGrpcHealthCheck().GetServiceName())

	// The same actions as the Istio example's (TestExampleIstio matches
	// those against the configuration's rules).
	var istio []*routev3.RateLimit
	for _, doc := range yamlDocs(t, filepath.Join("..", "examples", "istio", "envoyfilter.yaml")) {
		for _, patch := range dig(doc, "spec", "configPatches").([]any) {
			if dig(patch, "applyTo") != "VIRTUAL_HOST" {
				continue
			}
			for _, v := range dig(patch, "patch", "value", "rate_limits").([]any) {
				var r routev3.RateLimit
				require.NoError(t, protojson.Unmarshal(toJSON(t, v), &r))
				istio = append(istio, &r)
			}
		}
	}
	require.Len(t, actions, len(istio))
	for i := range actions {
		assert.True(t, proto.Equal(actions[i], istio[i]), "action %d: %v against %v", i, actions[i], istio[i])
	}
}
