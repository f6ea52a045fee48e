package rls

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// The Envoy bootstrap of examples/envoy is a valid Envoy v3 bootstrap (it
// decodes strictly into go-control-plane's types and passes their
// generated validation) and sends the domain the example configuration
// defines.
func TestExampleEnvoyBootstrap(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "examples", "envoy", "envoy.yaml"))
	require.NoError(t, err)
	var doc any
	require.NoError(t, yaml.Unmarshal(data, &doc))
	js, err := json.Marshal(doc)
	require.NoError(t, err)
	var bs bootstrapv3.Bootstrap
	require.NoError(t, protojson.Unmarshal(js, &bs))
	require.NoError(t, bs.ValidateAll())

	l := bs.GetStaticResources().GetListeners()
	require.Len(t, l, 1)
	var hcm hcmv3.HttpConnectionManager
	require.NoError(t, l[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm))
	var rl ratelimitfilterv3.RateLimit
	require.NoError(t, hcm.GetHttpFilters()[0].GetTypedConfig().UnmarshalTo(&rl))
	assert.Equal(t, "edge", rl.GetDomain())
	assert.Equal(t, "quotient_rls", rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName())

	c, err := LoadDir(filepath.Join("..", "examples", "envoy", "runtime", "ratelimit", DefaultAppDirectory), ParseOptions{})
	require.NoError(t, err)
	assert.Contains(t, c.Domains(), rl.GetDomain())
}
