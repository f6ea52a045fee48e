//go:build !race

package simulations

// raceBuild is true in a race build (see race_test.go).
const raceBuild = false
