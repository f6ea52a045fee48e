//go:build race

package live_test

const (
	timeScale = 10 // a 10 s epoch lasts 1 s
	rateScale = 10
)

// liveScenarios are the scenarios TestLiveMatchesVirtual runs. A race
// build runs abrupt-shift only (the one whose shares move, so the
// detector sees the rebalancing paths): `make test` compares both
// scenarios again without the race detector right after, and each costs
// 72 s here.
var liveScenarios = []string{"abrupt-shift"}
