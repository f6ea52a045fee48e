package simulations

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestMonthPoliciesAreRejectedByName(t *testing.T) {
	doc := `{"name": "m", "duration_s": 60, "regions": ["a"],
  "policies": [{"id": "p", "scope": "global", "algorithm": "fixed_window", "limit": 100, "window": "month"}],
  "traffic": [{"key": "k", "policies": ["p"], "rate": {"a": [[0, 1]]}}]}`
	_, err := ParseScenario([]byte(doc))
	assert.ErrorContains(t, err, "policies[0].window: calendar months are not simulated")
}
