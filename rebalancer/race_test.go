//go:build race

package rebalancer

// raceBuild is true in a race build: the random property tests then play
// a twentieth of their scenarios (raceCases), and `make test` plays them
// all once more without the race detector. They drive the Core, which
// starts no goroutine, from one goroutine: the race detector has little
// to find there and makes each scenario about ten times slower (a fifth
// of them took 78 s of the package's 159 s under -race).
const raceBuild = true
