//go:build race

package simulations

// raceBuild is true in a race build, where TestTransferCostOnTheSuite
// leaves out zipf-many-keys (3.1 million decisions: most of its minute
// under the detector); `make test` runs it whole again without it.
const raceBuild = true
