package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/quotientlabs/quotient/limiter"
)

// runPolicy implements `quotient policy validate FILE...`.
func runPolicy(_ context.Context, env environment, args []string) int {
	if len(args) == 0 || args[0] != "validate" {
		fmt.Fprintln(env.stderr, "usage: quotient policy validate FILE...")
		return 2
	}
	fs := flag.NewFlagSet("policy validate", flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	fs.Usage = func() {
		fmt.Fprintln(env.stderr, "usage: quotient policy validate FILE...\n\nChecks policy files (a JSON array of policy documents, or one document)\nand prints every problem with the path of the field; exits 1 if any.")
	}
	if err := parseFlags(fs, args[1:], env.lookupEnv); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	status := 0
	for _, file := range fs.Args() {
		data, err := os.ReadFile(file)
		if err != nil {
			fmt.Fprintf(env.stderr, "%s: %v\n", file, err)
			status = 1
			continue
		}
		policies, err := limiter.ParsePolicies(data)
		var perr *limiter.PolicyError
		switch {
		case errors.As(err, &perr):
			for _, f := range perr.Fields {
				fmt.Fprintf(env.stderr, "%s: %s\n", file, f)
			}
			status = 1
		case err != nil:
			fmt.Fprintf(env.stderr, "%s: %v\n", file, err)
			status = 1
		default:
			fmt.Fprintf(env.stdout, "%s: %d valid %s\n", file, len(policies), plural(len(policies), "policy", "policies"))
		}
	}
	return status
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
