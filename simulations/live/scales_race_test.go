//go:build race

package live_test

const (
	timeScale = 10 // a 10 s epoch lasts 1 s
	rateScale = 10
)
