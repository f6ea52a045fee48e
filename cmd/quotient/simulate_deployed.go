package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"time"

	"github.com/quotientlabs/quotient/simulations"
	"github.com/quotientlabs/quotient/simulations/deployed"
	"github.com/quotientlabs/quotient/simulations/live"
)

// deployedFlags are the flags of `quotient simulate --deployed`.
type deployedFlags struct {
	deployed      bool
	bin, devkafka string
	compare       bool
	timeout       time.Duration
	logs          string
}

func (df *deployedFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&df.deployed, "deployed", false, "run on the shipped binaries, each region a network namespace with its redis-server, coordinator and gateway, the broker (devkafka) on a host of its own (needs root, ip, nft, redis-server); --time-scale defaults to 5")
	fs.StringVar(&df.bin, "bin", "", "--deployed: the quotient binary the regions run (default: this executable)")
	fs.StringVar(&df.devkafka, "devkafka", "", "--deployed: the devkafka binary (default: devkafka next to the quotient binary, else on the PATH)")
	fs.BoolVar(&df.compare, "compare", true, "--deployed: also run virtual time on the same (rate-scaled) scenario and print both per-window errors")
	fs.StringVar(&df.logs, "logs", "", "--deployed: keep the processes' logs and the policy and key files in this folder (default: a temporary one, removed after a run that did not fail)")
	fs.DurationVar(&df.timeout, "store-timeout", 5*time.Millisecond, "--deployed: the gateways' --timeout (deadline of every Redis call)")
}

// config checks the deployed flags against the live ones (shared:
// --time-scale, --rate-scale) and returns the deployed configuration.
func (df *deployedFlags) config(fs *flag.FlagSet, lf liveFlags, cold bool) (deployed.Config, error) {
	cfg := deployed.DefaultConfig()
	if !df.deployed {
		if df.bin != "" || df.devkafka != "" {
			return cfg, errors.New("--bin and --devkafka need --deployed")
		}
		return cfg, nil
	}
	switch {
	case lf.live:
		return cfg, errors.New("--deployed and --live exclude each other")
	case cold:
		return cfg, errors.New("--cold-start is for virtual time; --deployed starts the coordinators a few epochs early")
	case lf.kafka != "" || lf.redis != "":
		return cfg, errors.New("--kafka and --redis are for --live; --deployed starts its own broker and Redis servers")
	case !(lf.rateScale > 0):
		return cfg, fmt.Errorf("--rate-scale %v: want a number > 0", lf.rateScale)
	case df.timeout <= 0:
		return cfg, fmt.Errorf("--store-timeout %v: want > 0", df.timeout)
	}
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "time-scale" })
	if set {
		if lf.timeScale < 1 {
			return cfg, fmt.Errorf("--time-scale %d: want at least 1", lf.timeScale)
		}
		cfg.TimeScale = lf.timeScale
	}
	cfg.StoreDeadline = df.timeout
	cfg.Dir = df.logs
	for _, p := range []*string{&df.bin, &df.devkafka} {
		if *p != "" {
			abs, err := filepath.Abs(*p)
			if err != nil {
				return cfg, err
			}
			*p = abs
		}
	}
	cfg.Quotient, cfg.Devkafka = df.bin, df.devkafka
	return cfg, nil
}

// runDeployedFile runs one parsed scenario in deployed mode (and, with
// --compare, in virtual time at the same rate scale) and returns the
// deployed report (nil when it did not run) and an exit status: 2 for a
// scenario deployed mode cannot run, a machine that lacks what it needs
// or a failed run, 1 when the scenario misses its target.
func runDeployedFile(ctx context.Context, env environment, file string, sc *simulations.Scenario, df deployedFlags, lf liveFlags, cfg deployed.Config, progress bool, out string) (*simulations.Report, int) {
	scaled, err := live.ScaleRates(sc, lf.rateScale)
	if err == nil {
		err = deployed.Check(scaled)
	}
	if err == nil {
		err = deployed.Available(cfg)
	}
	if printRefusal(env, file, err) {
		return nil, 2
	}
	if progress {
		cfg.Progress = progressPrinter(env.stderr, sc.Name+" (deployed)")
	}
	rep, st, err := deployed.Run(ctx, scaled, cfg)
	if progress {
		fmt.Fprint(env.stderr, "\r\033[K")
	}
	if err != nil {
		fmt.Fprintf(env.stderr, "%s: %v\n", file, err)
		if st.Dir != "" {
			fmt.Fprintf(env.stderr, "%s: the processes' logs are in %s\n", file, st.Dir)
		}
		return nil, 2
	}
	for _, n := range st.Applied {
		fmt.Fprintf(env.stderr, "%s: applied deployed: %s\n", file, n)
	}
	for _, n := range st.NotApplied {
		fmt.Fprintf(env.stderr, "%s: not applied deployed: %s\n", file, n)
	}
	for _, n := range st.Warnings {
		fmt.Fprintf(env.stderr, "%s: warning: %s\n", file, n)
	}
	if ok, why := st.Faithful(); !ok {
		fmt.Fprintf(env.stderr, "%s: warning: this machine did not keep the real-time schedule (%s); try a smaller --time-scale or a larger --rate-scale\n", file, why)
	}
	fmt.Fprintf(env.stdout, "%s (deployed, time scale %d, rate scale %v): %d requests answered, %d errors, %d store fallbacks, worst lateness %v\n",
		sc.Name, st.TimeScale, lf.rateScale, st.Requests, st.Errors, st.Fallback, st.MaxLateness.Round(time.Millisecond))
	if df.compare {
		virt, err := simulations.Run(ctx, scaled, simulations.Options{})
		if err != nil {
			fmt.Fprintf(env.stderr, "%s: virtual time: %v\n", file, err)
			return rep, 2
		}
		if err := virt.WriteFiles(filepath.Join(out, "virtual")); err != nil {
			fmt.Fprintf(env.stderr, "%s: %v\n", file, err)
			return rep, 2
		}
		c, err := deployed.Compare(rep, virt)
		if err != nil {
			fmt.Fprintf(env.stderr, "%s: %v\n", file, err)
			return rep, 2
		}
		fmt.Fprintf(env.stdout, "%s: virtual worst over %.1f%% under %.1f%%; deployed worst over %.1f%% under %.1f%%\n",
			sc.Name, 100*virt.Worst.MaxOver, 100*virt.Worst.MaxUnder, 100*rep.Worst.MaxOver, 100*rep.Worst.MaxUnder)
		if err := c.WriteTable(env.stdout, rep.WindowStarts(), 8); err != nil {
			return rep, 2
		}
	}
	if !rep.Pass {
		return rep, 1
	}
	return rep, 0
}
