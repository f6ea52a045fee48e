package rls

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/quotientlabs/quotient/limiter"
)

// yamlDocs decodes every document of a multi-document YAML file.
func yamlDocs(t *testing.T, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []map[string]any
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return docs
		}
		require.NoError(t, err, path)
		docs = append(docs, doc)
	}
}

func toJSON(t *testing.T, v any) []byte {
	t.Helper()
	js, err := json.Marshal(v)
	require.NoError(t, err)
	return js
}

func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			s, _ := v.([]any)
			if k >= len(s) {
				return nil
			}
			v = s[k]
		}
	}
	return v
}

// The Istio example: the EnvoyFilter patches decode into Envoy's v3 types
// and validate, the filter's domain is the configuration's, the
// configuration loads and every policy it names is in the policy file,
// and the descriptors the rate limit actions produce match rules.
func TestExampleIstio(t *testing.T) {
	dir := filepath.Join("..", "examples", "istio")
	var rl ratelimitfilterv3.RateLimit
	var actions []*routev3.RateLimit
	for _, doc := range yamlDocs(t, filepath.Join(dir, "envoyfilter.yaml")) {
		require.Equal(t, "EnvoyFilter", doc["kind"])
		for _, patch := range dig(doc, "spec", "configPatches").([]any) {
			switch dig(patch, "applyTo") {
			case "HTTP_FILTER":
				var a anypb.Any
				require.NoError(t, protojson.Unmarshal(toJSON(t, dig(patch, "patch", "value", "typed_config")), &a))
				require.NoError(t, a.UnmarshalTo(&rl))
				require.NoError(t, rl.ValidateAll())
			case "VIRTUAL_HOST":
				for _, v := range dig(patch, "patch", "value", "rate_limits").([]any) {
					var r routev3.RateLimit
					require.NoError(t, protojson.Unmarshal(toJSON(t, v), &r))
					require.NoError(t, r.ValidateAll())
					actions = append(actions, &r)
				}
			default:
				t.Fatalf("unexpected patch %v", dig(patch, "applyTo"))
			}
		}
	}
	assert.Equal(t, "mesh", rl.GetDomain())
	assert.Len(t, actions, 3)

	var cfg *Config
	var policies []*limiter.Policy
	for _, doc := range yamlDocs(t, filepath.Join(dir, "quotient-rls.yaml")) {
		if doc["kind"] != "ConfigMap" {
			continue
		}
		if y, ok := dig(doc, "data", "mesh.yaml").(string); ok {
			var err error
			cfg, err = Parse([]File{{Name: "mesh.yaml", Data: []byte(y)}}, ParseOptions{})
			require.NoError(t, err)
		}
		if js, ok := dig(doc, "data", "policies.json").(string); ok {
			var err error
			policies, err = limiter.ParsePolicies([]byte(js))
			require.NoError(t, err)
		}
	}
	require.NotNil(t, cfg)
	assert.Equal(t, []string{rl.GetDomain()}, cfg.Domains())
	ids := map[string]bool{}
	for _, p := range policies {
		ids[p.ID] = true
	}
	id, _ := cfg.MissingPolicy(func(id string) bool { return ids[id] })
	assert.Empty(t, id, "every policy the configuration names is in policies.json")
	// The descriptors the three actions produce.
	for _, es := range [][]Entry{
		{{"remote_address", "203.0.113.7"}},
		{{"api_key", "k-123"}},
		{{"login", "1"}, {"login_user", "alice"}},
	} {
		assert.NotNil(t, cfg.Lookup("mesh", es).Rule, "%v", es)
	}
}
