package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/quotientlabs/quotient/simulations"
	"github.com/quotientlabs/quotient/simulations/live"
)

// runSimulate implements `quotient simulate [--out DIR] [--seed N] FILE...`:
// it validates every scenario file, runs the valid ones in virtual time
// (or, with --live, in scaled real time against real Redis servers, a
// Kafka broker and the region coordinators, see package simulations/live;
// or, with --deployed, on the shipped binaries in network namespaces, see
// package simulations/deployed),
// writes their outputs into --out and prints the accuracy table. Exit
// status: 0 when every scenario meets its target, 1 when one misses it, 2
// when a file is invalid (or uses a field live or deployed mode does not
// support), the machine lacks what --deployed needs (root, ip, nft,
// redis-server, the binaries; the message names it) or a run fails (the
// other files still run).
func runSimulate(ctx context.Context, env environment, args []string) int {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	out := fs.String("out", "out/simulate", "folder for the outputs (summary, tables, plot per scenario)")
	seed := fs.String("seed", "", "seed for every scenario, replacing the files' own (an integer)")
	cold := fs.Bool("cold-start", false, "start the coordinators with the traffic at t=0 (default: they run for a few epochs before it, as in a deployed system)")
	progress := fs.Bool("progress", isTerminal(env.stderr), "show progress on stderr (default: when stderr is a terminal)")
	var lf liveFlags
	lf.register(fs)
	var df deployedFlags
	df.register(fs)
	fs.Usage = func() {
		fmt.Fprintln(env.stderr, "usage: quotient simulate [--out DIR] [--seed N] [--cold-start] [--rate-scale F] FILE...")
		fmt.Fprintln(env.stderr, "       quotient simulate --deployed [--time-scale N] [--rate-scale F] [--bin QUOTIENT] [--devkafka DEVKAFKA] [--out DIR] [--seed N] FILE...")
		fmt.Fprintln(env.stderr, "       quotient simulate --live --kafka ADDR --redis REGION=ADDR,... [--time-scale N] [--rate-scale F] [--out DIR] [--seed N] FILE...")
		fmt.Fprintln(env.stderr, "\nRuns scenario files (see simulations/doc.go) in virtual time through the real limiter")
		fmt.Fprintln(env.stderr, "and writes <name>.summary.json, .windows.csv, .seconds.csv and .svg into DIR.")
		fmt.Fprintln(env.stderr, "Exit status: 0 all scenarios pass, 1 one misses its target, 2 bad input or internal error.")
		fmt.Fprintln(env.stderr, "\nflags:")
		fs.PrintDefaults()
	}
	if code, stop := flagsExit(env, "simulate", parseFlags(fs, args, env.lookupEnv)); stop {
		return code
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	var seedOverride *int64
	if *seed != "" {
		v, err := strconv.ParseInt(*seed, 10, 64)
		if err != nil {
			fmt.Fprintf(env.stderr, "quotient simulate: --seed %q: want an integer\n", *seed)
			return 2
		}
		seedOverride = &v
	}
	if !df.deployed && !lf.live {
		timeScaled := false
		fs.Visit(func(f *flag.Flag) { timeScaled = timeScaled || f.Name == "time-scale" })
		if timeScaled {
			fmt.Fprintln(env.stderr, "quotient simulate: --time-scale applies to --live and --deployed only; virtual time needs no compression")
			return 2
		}
		if !(lf.rateScale > 0) || math.IsInf(lf.rateScale, 0) {
			fmt.Fprintf(env.stderr, "quotient simulate: --rate-scale %v: want a number > 0\n", lf.rateScale)
			return 2
		}
	}
	dcfg, err := df.config(fs, lf, *cold)
	if err != nil {
		fmt.Fprintln(env.stderr, "quotient simulate:", err)
		return 2
	}
	if df.deployed {
		lf.live = false // deployed mode shares --time-scale and --rate-scale only
	}
	lcfg, err := lf.config(*cold)
	if err != nil {
		fmt.Fprintln(env.stderr, "quotient simulate:", err)
		return 2
	}

	status := 0
	var reports []*simulations.Report
	for _, file := range fs.Args() {
		data, err := os.ReadFile(file)
		if err != nil {
			fmt.Fprintf(env.stderr, "%s: %v\n", file, err)
			status = 2
			continue
		}
		sc, err := simulations.ParseScenario(data)
		var serr *simulations.ScenarioError
		switch {
		case errors.As(err, &serr):
			for _, p := range serr.Problems {
				fmt.Fprintf(env.stderr, "%s: %s\n", file, p)
			}
			status = 2
			continue
		case err != nil:
			fmt.Fprintf(env.stderr, "%s: %v\n", file, err)
			status = 2
			continue
		}
		if seedOverride != nil {
			sc.Seed = *seedOverride
		}
		if df.deployed {
			rep, code := runDeployedFile(ctx, env, file, sc, df, lf, dcfg, *progress, *out)
			if rep != nil {
				if err := rep.WriteFiles(*out); err != nil {
					fmt.Fprintf(env.stderr, "%s: %v\n", file, err)
					code = 2
				}
				reports = append(reports, rep)
			}
			status = max(status, code)
			continue
		}
		if lf.live {
			rep, code := runLiveFile(ctx, env, file, sc, lf, lcfg, *progress)
			if rep != nil {
				if err := rep.WriteFiles(*out); err != nil {
					fmt.Fprintf(env.stderr, "%s: %v\n", file, err)
					code = 2
				}
				reports = append(reports, rep)
			}
			status = max(status, code)
			continue
		}
		// --rate-scale in virtual time: the scenario at 1/F of its rates
		// (what deployed and live mode compare against), e.g. to see the
		// protocol at a few requests per second per key.
		if sc, err = live.ScaleRates(sc, lf.rateScale); err != nil {
			fmt.Fprintf(env.stderr, "%s: %v\n", file, err)
			status = 2
			continue
		}
		opt := simulations.Options{ColdStart: *cold}
		if *progress {
			opt.Progress = progressPrinter(env.stderr, sc.Name)
		}
		start := time.Now()
		rep, err := simulations.Run(ctx, sc, opt)
		if *progress {
			fmt.Fprint(env.stderr, "\r\033[K")
		}
		if err != nil {
			fmt.Fprintf(env.stderr, "%s: %v\n", file, err)
			status = 2
			continue
		}
		rep.Wall = time.Since(start)
		if err := rep.WriteFiles(*out); err != nil {
			fmt.Fprintf(env.stderr, "%s: %v\n", file, err)
			status = 2
		}
		reports = append(reports, rep)
		if !rep.Pass && status == 0 {
			status = 1
		}
	}
	if len(reports) > 0 {
		printTable(env.stdout, reports)
		fmt.Fprintf(env.stdout, "\noutputs in %s\n", *out)
	}
	return status
}

// printTable prints one row per scenario: pass, the worst over-admission
// and under-service (in % of the window allowance, with the target), the
// decisions and the wall time.
func printTable(w io.Writer, reports []*simulations.Report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tpass\tworst over\tworst under\tdecisions\twall time\tdecisions/s")
	for _, r := range reports {
		pass := "PASS"
		if !r.Pass {
			pass = "FAIL"
		}
		rate := "-"
		if s := r.Wall.Seconds(); s > 0 {
			rate = fmt.Sprintf("%.2fM", float64(r.Decisions)/s/1e6)
		}
		fmt.Fprintf(tw, "%s\t%s\t%5.1f%% (max %.0f%%)\t%5.1f%% (max %.0f%%)\t%d\t%.2fs\t%s\n",
			r.Scenario, pass, 100*r.Worst.MaxOver, 100*r.Target.MaxOver, 100*r.Worst.MaxUnder, 100*r.Target.MaxUnder,
			r.Decisions, r.Wall.Seconds(), rate)
	}
	tw.Flush()
}

// progressPrinter redraws one status line at most ten times a second.
func progressPrinter(w io.Writer, name string) func(done, total int64) {
	var last time.Time
	return func(done, total int64) {
		if now := time.Now(); now.Sub(last) >= 100*time.Millisecond || done == total {
			last = now
			fmt.Fprintf(w, "\r\033[K%s: %d/%d simulated s (%d%%)", name, done, total, 100*done/total)
		}
	}
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
