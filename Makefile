# Quotient: build, test, lint, benchmark, simulate.
# `make simulate` is the main job; `make test` installs what the tests need
# (redis-server through apt when run as root) and runs the whole suite with
# the race detector.

SHELL := /bin/bash
GO ?= go
GOBIN := $(shell $(GO) env GOPATH)/bin
export PATH := $(GOBIN):$(PATH)

FUZZTIME ?= 3000x
BENCHTIME ?= 2s
PKGS := ./...

.PHONY: all build test test-unit e2e e2e-faults fuzz lint bench bench-limiter bench-rls bench-scale simulate simulate-deployed proto deps tools clean

all: build

build:
	$(GO) build $(PKGS)

deps:
	@./scripts/deps.sh

## test: the whole suite, race detector on, against real redis-server processes
test: deps
	./scripts/terraform-check.sh install
	$(GO) build $(PKGS)
	# Slowest packages first (scripts/race-packages.sh), three at a time:
	# the tests wait on real servers and timers more than they compute
	# (about 1.2 of the 2 cores busy at -p 2).
	pkgs=$$(./scripts/race-packages.sh) && $(GO) test -race -count=1 -p 3 -timeout 45m $$pkgs
	# The rebalancer's random property tests at full count without the race
	# detector (a race build plays a fifth of their scenarios).
	$(GO) test -count=1 -timeout 10m -run '^(TestSafetyUnderChaos|TestOrderAndDuplicatesChangeNothing|TestTransfersSafetyUnderChaos|TestMajorityRule.*)$$' ./rebalancer/
	# The standard suite's targets and its transfer cost, every scenario (a
	# race build plays a sample of them).
	$(GO) test -count=1 -timeout 10m -run '^(TestStandardSuiteMeetsItsTargets|TestTransferCostOnTheSuite)$$' ./simulations/
	# The shipped binaries end to end (three regions on loopback), alone so
	# that the processes keep the deployment's timing; the test process
	# itself only paces clients, so the race detector adds nothing there.
	$(MAKE) e2e
	# The live simulator against virtual time once more, alone and without the
	# race detector's slowdown, so that it keeps its real-time schedule and the
	# 5-point comparison runs (under -race on a busy machine it may skip it).
	set -o pipefail; $(GO) test -count=1 -timeout 10m -run 'TestLiveMatchesVirtual' -v ./simulations/live/ | grep -E '^(=== RUN|--- |\s+live_test.go|ok|FAIL|PASS)'
	FUZZTIME=$(FUZZTIME) ./scripts/fuzz.sh

## e2e: the shipped binaries end to end: three regions of redis-server,
## quotient coordinator and quotient gateway, devkafka, paced clients
e2e: deps
	./scripts/e2e.sh

## e2e-faults: the resilience rows at full length through the binaries (each
## region on its own network namespace; needs root, ip, nft): a region and the
## broker cut off for QUOTIENT_E2E_FAULT_FOR each (default 10m), redis-server
## killed, the coordinator leader killed, a gateway restarted; about 12 minutes, the tests in parallel
e2e-faults: deps
	./scripts/e2e-faults.sh

## lint: gofmt, go vet and staticcheck must be clean, and the Terraform
## modules hclfmt- and tflint-clean (their Go checks are tests: make test
## runs them; scripts/terraform-check.sh alone runs everything)
lint:
	@./scripts/tools.sh
	@./scripts/terraform-check.sh static
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	staticcheck $(PKGS)

## bench: benchmarks with memory statistics (see README for the numbers measured),
## then the limiter core's figures, unpinned and pinned (bench-limiter)
bench: deps
	$(GO) test -run '^$$' -bench . -skip '^(BenchmarkCompareRedisRate|BenchmarkCheckLatencyAtHalfPeak|BenchmarkMemoryStore)$$' -benchmem -benchtime $(BENCHTIME) $(PKGS)
	./scripts/bench-limiter.sh

## bench-limiter: the limiter core's figures of the README in one run: Check
## against redis_rate and its latency at half peak, unpinned and with
## redis-server and the benchmark on separate cores (taskset), and the
## MemoryStore on one core
bench-limiter: deps
	./scripts/bench-limiter.sh

## bench-rls: envoyproxy/ratelimit (built from its Go module) and quotient rls side by side on one redis-server, pinned and unpinned (scripts/bench-rls.sh)
bench-rls:
	bash scripts/bench-rls.sh

## bench-scale: one coordinator epoch (real redis-server and broker) at 10k, 100k
## and 1M active keys: wall and CPU per phase, memory per key, Kafka bytes, the
## longest Redis command; every share changing (BenchmarkEpochScale; about 8
## minutes, over 2.6 GB), then nothing changing, averaged over a full-report cycle
## of 6 epochs (BenchmarkEpochScaleQuiet; about 5 minutes), and the quiet 1M epoch
## again with redis-server pinned to CPU 0 and the coordinator to CPU 1, so that
## SLOWLOG and the gateway probe measure Redis and not the two taking each
## other's core (about 3 minutes); under the machine-wide benchmark lock
bench-scale: deps
	QUOTIENT_BENCH_1M=1 flock /tmp/quotient-deployed.lock $(GO) test -run '^$$' -bench '^BenchmarkEpochScale$$' -benchtime 2x -timeout 60m ./rebalancer/
	QUOTIENT_BENCH_1M=1 flock /tmp/quotient-deployed.lock $(GO) test -run '^$$' -bench '^BenchmarkEpochScaleQuiet$$' -benchtime 6x -timeout 60m ./rebalancer/
	QUOTIENT_BENCH_1M=1 QUOTIENT_BENCH_REDIS_CPUS=0 flock /tmp/quotient-deployed.lock taskset -c 1 $(GO) test -run '^$$' -bench '^BenchmarkEpochScaleQuiet$$/^keys=1M$$' -benchtime 6x -timeout 60m ./rebalancer/

## simulate: the standard scenario suite in virtual time; prints the accuracy table
simulate:
	$(GO) run ./cmd/quotient simulate --out out/simulate simulations/scenarios/*.json

## simulate-deployed: the scenarios deployed mode can run, on the shipped
## binaries (a network namespace per region, devkafka on its own host),
## time-compressed by TIME_SCALE and lightened by RATE_SCALE, each beside
## its virtual-time run (needs root, ip, nft, redis-server; one run at a time);
## the rlqs-* scenarios (Envoys) run in virtual time only
TIME_SCALE ?= 5
RATE_SCALE ?= 5
DEPLOYED_SCENARIOS ?= $(filter-out %/fixed-window-replicated.json %/zipf-many-keys.json %/rlqs-abrupt-shift.json %/rlqs-flash-crowd.json %/rlqs-many-envoys.json,$(wildcard simulations/scenarios/*.json))
simulate-deployed: deps
	mkdir -p out/bin
	CGO_ENABLED=0 $(GO) build -o out/bin/quotient ./cmd/quotient
	CGO_ENABLED=0 $(GO) build -o out/bin/devkafka ./cmd/devkafka
	out/bin/quotient simulate --deployed --time-scale $(TIME_SCALE) --rate-scale $(RATE_SCALE) --out out/deployed $(DEPLOYED_SCENARIOS)

## proto: regenerate the committed protobuf code
proto:
	@./scripts/tools.sh proto
	@command -v protoc >/dev/null || { echo "protoc missing: apt-get install -y protobuf-compiler"; exit 1; }
	protoc --proto_path=proto --go_out=. --go_opt=module=github.com/quotientlabs/quotient $$(find proto -name '*.proto' | sort)

clean:
	rm -rf out
