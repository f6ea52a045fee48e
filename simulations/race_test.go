//go:build race

package simulations

// raceBuild is true in a race build, where TestStandardSuiteMeetsItsTargets
// plays every third scenario and TestTransferCostOnTheSuite two (the
// whole suite takes some 90 s under the detector, zipf-many-keys most of
// it); `make test` runs both whole again without it.
const raceBuild = true
