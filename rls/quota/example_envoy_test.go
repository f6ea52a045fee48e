package quota

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/quotientlabs/quotient/rls"
)

// examples/envoy/rlqs.yaml is a valid Envoy v3 bootstrap (strict decoding
// into go-control-plane's types and their generated validation), and the
// bucket its matcher builds reaches a rule of the example configuration.
func TestExampleEnvoyRLQSBootstrap(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "examples", "envoy", "rlqs.yaml"))
	require.NoError(t, err)
	var doc any
	require.NoError(t, yaml.Unmarshal(data, &doc))
	js, err := json.Marshal(doc)
	require.NoError(t, err)
	var bs bootstrapv3.Bootstrap
	require.NoError(t, protojson.Unmarshal(js, &bs))
	require.NoError(t, bs.ValidateAll())

	var hcm hcmv3.HttpConnectionManager
	require.NoError(t, bs.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm))
	var fc rlqsfilterv3.RateLimitQuotaFilterConfig
	require.NoError(t, hcm.GetHttpFilters()[0].GetTypedConfig().UnmarshalTo(&fc))
	require.NoError(t, fc.ValidateAll())
	assert.Equal(t, "quotient_rlqs", fc.GetRlqsServer().GetEnvoyGrpc().GetClusterName())

	m := fc.GetBucketMatchers()
	var settings rlqsfilterv3.RateLimitQuotaBucketSettings
	require.NoError(t, m.GetMatcherList().GetMatchers()[0].GetOnMatch().GetAction().GetTypedConfig().UnmarshalTo(&settings))
	require.NoError(t, settings.ValidateAll())
	id := map[string]string{}
	for k, v := range settings.GetBucketIdBuilder().GetBucketIdBuilder() {
		id[k] = v.GetStringValue()
		if v.GetCustomValue() != nil {
			id[k] = "key-123" // what the x-api-key header gives
		}
	}
	c, err := rls.LoadDir(filepath.Join("..", "..", "examples", "envoy", "runtime", "ratelimit", rls.DefaultAppDirectory), rls.ParseOptions{})
	require.NoError(t, err)
	b, ok := c.LookupBucket(fc.GetDomain(), id)
	require.True(t, ok, "bucket %v of domain %q matches no rule", id, fc.GetDomain())
	assert.Equal(t, uint32(1000), b.Rule.RequestsPerUnit)
	assert.Equal(t, rls.Hour, b.Rule.Unit)
}
