// Command quotient is Quotient's single binary. Its subcommands run the
// pieces of the system: the reference gateway, the per-region coordinator,
// the simulator, and tools for policies.
//
// This package is the only place that reads flags and the environment: every
// flag of every subcommand can also be set by an environment variable named
// QUOTIENT_ followed by the flag name in upper case with dashes replaced by
// underscores (--trusted-proxies is QUOTIENT_TRUSTED_PROXIES). A flag given on
// the command line wins over the environment.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one subcommand. It returns the process exit status.
type command struct {
	summary string
	run     func(ctx context.Context, env environment, args []string) int
}

// environment is what a subcommand may touch of the process: its output
// streams and its environment variables. Tests pass their own.
type environment struct {
	stdout, stderr io.Writer
	lookupEnv      func(string) (string, bool)
}

func commands() map[string]command {
	return map[string]command{
		"admin":       {"call a coordinator's admin API (policies, overrides, audit, key usage)", runAdmin},
		"gateway":     {"rate limiting reverse proxy in front of an upstream", runGateway},
		"coordinator": {"run one region's coordinator (global shares over Kafka)", runCoordinator},
		"policy":      {"validate policy documents", runPolicy},
		"rls":         {"Envoy rate limit service (gRPC) with envoyproxy/ratelimit configuration files", runRLS},
		"simulate":    {"run scenario files in virtual time and report global accuracy", runSimulate},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, environment{stdout: os.Stdout, stderr: os.Stderr, lookupEnv: os.LookupEnv}, os.Args[1:])
	stop()
	os.Exit(code)
}

func run(ctx context.Context, env environment, args []string) int {
	cmds := commands()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(env.stderr, cmds)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(env.stderr, "quotient: unknown command %q\n\n", args[0])
		usage(env.stderr, cmds)
		return 2
	}
	return cmd.run(ctx, env, args[1:])
}

func usage(w io.Writer, cmds map[string]command) {
	fmt.Fprintln(w, "usage: quotient COMMAND [flags] [args]")
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(cmds))
	for name := range cmds {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(w, "  %-12s %s\n", name, cmds[name].summary)
	}
	fmt.Fprintln(w, "\nRun 'quotient COMMAND -h' for the flags of a command.")
}
