//go:build !race

package live_test

const (
	timeScale = 20 // a 10 s epoch lasts 500 ms
	rateScale = 5
)
