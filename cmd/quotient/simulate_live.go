package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/quotientlabs/quotient/simulations"
	"github.com/quotientlabs/quotient/simulations/live"
)

// liveFlags are the flags of `quotient simulate --live`.
type liveFlags struct {
	live      bool
	kafka     string
	redis     string
	timeScale int
	rateScale float64
}

func (lf *liveFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&lf.live, "live", false, "run in scaled real time against real Redis servers (--redis), a Kafka broker (--kafka) and one coordinator per region, instead of virtual time")
	fs.StringVar(&lf.kafka, "kafka", "", "--live: Kafka bootstrap brokers, host:port[,...] (for a local broker: go run ./cmd/devkafka)")
	fs.StringVar(&lf.redis, "redis", "", "--live: one standalone Redis per region, REGION=host:port[,...] (one run at a time per server)")
	fs.IntVar(&lf.timeScale, "time-scale", live.DefaultConfig().TimeScale, "--live: scenario seconds per real second (durations divided, policy rates multiplied by it)")
	fs.Float64Var(&lf.rateScale, "rate-scale", 1, "--live: divide every request rate, policy rate and burst by this (a lighter scenario, compared with its own virtual-time run)")
}

// config checks the live flags and returns the live configuration (without
// Progress); errors name the flag.
func (lf *liveFlags) config(coldStart bool) (live.Config, error) {
	cfg := live.DefaultConfig()
	if !lf.live {
		switch {
		case lf.kafka != "":
			return cfg, errors.New("--kafka needs --live")
		case lf.redis != "":
			return cfg, errors.New("--redis needs --live")
		}
		return cfg, nil
	}
	if coldStart {
		return cfg, errors.New("--cold-start is for virtual time; --live always starts the coordinators a few epochs early")
	}
	cfg.KafkaBrokers = splitList(lf.kafka)
	if len(cfg.KafkaBrokers) == 0 {
		return cfg, errors.New("--live needs --kafka host:port (for a local broker: go run ./cmd/devkafka)")
	}
	if lf.timeScale < 1 {
		return cfg, fmt.Errorf("--time-scale %d: want at least 1", lf.timeScale)
	}
	if !(lf.rateScale > 0) {
		return cfg, fmt.Errorf("--rate-scale %v: want a number > 0", lf.rateScale)
	}
	cfg.TimeScale = lf.timeScale
	cfg.RedisAddrs = map[string]string{}
	for _, item := range splitList(lf.redis) {
		region, addr, ok := strings.Cut(item, "=")
		if !ok || region == "" || addr == "" {
			return cfg, fmt.Errorf("--redis %q: want REGION=host:port, comma separated", item)
		}
		if _, dup := cfg.RedisAddrs[region]; dup {
			return cfg, fmt.Errorf("--redis: region %q given twice", region)
		}
		cfg.RedisAddrs[region] = addr
	}
	if len(cfg.RedisAddrs) == 0 {
		return cfg, errors.New("--live needs --redis REGION=host:port,... (one Redis per region)")
	}
	return cfg, nil
}

// runLiveFile runs one parsed scenario in live mode and returns its report
// (nil when it did not run) and an exit status: 2 for a scenario field
// live mode does not support, a bad configuration or a failed run, 1 when
// the scenario misses its target.
func runLiveFile(ctx context.Context, env environment, file string, sc *simulations.Scenario, lf liveFlags, cfg live.Config, progress bool) (*simulations.Report, int) {
	scaled, err := live.ScaleRates(sc, lf.rateScale)
	if err == nil {
		err = live.Check(scaled)
	}
	if printRefusal(env, file, err) {
		return nil, 2
	}
	if progress {
		cfg.Progress = progressPrinter(env.stderr, sc.Name+" (live)")
	}
	rep, st, err := live.Run(ctx, scaled, cfg)
	if progress {
		fmt.Fprint(env.stderr, "\r\033[K")
	}
	if err != nil {
		fmt.Fprintf(env.stderr, "%s: %v\n", file, err)
		return nil, 2
	}
	if ok, why := st.Faithful(); !ok {
		fmt.Fprintf(env.stderr, "%s: warning: this machine did not keep the real-time schedule (%s); try a smaller --time-scale or a larger --rate-scale\n", file, why)
	}
	if !rep.Pass {
		return rep, 1
	}
	return rep, 0
}

// printRefusal prints why a scenario cannot run (every problem of a
// *simulations.ScenarioError, one per line, or the error) and reports
// whether there was one (err != nil).
func printRefusal(env environment, file string, err error) bool {
	var serr *simulations.ScenarioError
	switch {
	case errors.As(err, &serr):
		for _, p := range serr.Problems {
			fmt.Fprintf(env.stderr, "%s: %s\n", file, p)
		}
	case err != nil:
		fmt.Fprintf(env.stderr, "%s: %v\n", file, err)
	}
	return err != nil
}
