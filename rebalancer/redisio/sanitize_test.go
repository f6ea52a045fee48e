package redisio

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
)

func TestSanitizeKeepsAnEpochWithARetriedFlush(t *testing.T) {
	u, ok := sanitize(limiter.UsageTotal{PolicyID: "p", SubjectKey: "k:a", Demand: 5, Admitted: 7})
	assert.True(t, ok)
	assert.Equal(t, rebalancer.Usage{Key: rebalancer.Key{PolicyID: "p", Subject: "k:a"}, Demand: 7, Admitted: 7}, u, "admitted counted twice: demand raised to it")
	u, ok = sanitize(limiter.UsageTotal{PolicyID: "p", SubjectKey: "k:a", Demand: 9, Admitted: 4})
	assert.True(t, ok)
	assert.Equal(t, int64(9), u.Demand)
	_, ok = sanitize(limiter.UsageTotal{PolicyID: "p", SubjectKey: "k:a", Demand: -1})
	assert.False(t, ok)
	_, ok = sanitize(limiter.UsageTotal{SubjectKey: "k:a", Demand: 1})
	assert.False(t, ok)
}
