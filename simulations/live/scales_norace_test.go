//go:build !race

package live_test

const (
	timeScale = 20 // a 10 s epoch lasts 500 ms
	rateScale = 5
)

// liveScenarios are the scenarios TestLiveMatchesVirtual runs.
var liveScenarios = []string{"even-spread", "abrupt-shift"}
