package monitoring

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

var metricRef = regexp.MustCompile(`quotient_[a-z_]+`)

// registered are the quotient_* names the Go code declares.
func registered(t *testing.T) map[string]bool {
	names := map[string]bool{}
	decl := regexp.MustCompile(`Name: *"(quotient_[a-z_]+)"`)
	for _, dir := range []string{"../../limiter", "../../region", "../../region/policysync", "../../cmd/quotient"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		require.NoError(t, err)
		for _, f := range files {
			b, err := os.ReadFile(f)
			require.NoError(t, err)
			for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
				names[m[1]] = true
			}
		}
	}
	require.NotEmpty(t, names)
	return names
}

func checkRefs(t *testing.T, where, expr string, names map[string]bool) {
	for _, ref := range metricRef.FindAllString(expr, -1) {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(ref, "_bucket"), "_count"), "_sum")
		assert.True(t, names[base], "%s: %s is not a metric the code registers", where, ref)
	}
}

func TestAlertRules(t *testing.T) {
	b, err := os.ReadFile("alerts.yml")
	require.NoError(t, err)
	var f struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&f))
	names := registered(t)
	n := 0
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			n++
			assert.NotEmpty(t, r.Alert)
			assert.NotEmpty(t, r.Expr, r.Alert)
			assert.NotEmpty(t, r.For, r.Alert)
			assert.NotEmpty(t, r.Labels["severity"], r.Alert)
			assert.NotEmpty(t, r.Annotations["summary"], r.Alert)
			checkRefs(t, r.Alert, r.Expr, names)
		}
	}
	assert.GreaterOrEqual(t, n, 4, "one rule per 9.3 threshold at least")
}

func TestDashboard(t *testing.T) {
	b, err := os.ReadFile("grafana-dashboard.json")
	require.NoError(t, err)
	var d struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(b, &d))
	names := registered(t)
	require.NotEmpty(t, d.Panels)
	for _, p := range d.Panels {
		require.NotEmpty(t, p.Targets, p.Title)
		for _, tg := range p.Targets {
			checkRefs(t, p.Title, tg.Expr, names)
		}
	}
}
