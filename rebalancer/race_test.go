//go:build race

package rebalancer

// raceBuild is true in a race build: the random property tests then play
// a fifth of their scenarios (the race detector makes each about ten
// times slower), and `make test` plays them all once more without it.
const raceBuild = true
