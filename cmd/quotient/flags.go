package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
)

// envName is the environment variable that sets flag name.
func envName(flagName string) string {
	return "QUOTIENT_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseFlags parses args into fs, then sets every flag that the command line
// did not set from its environment variable (see envName), if present. An
// environment value that does not parse is an error naming the variable.
func parseFlags(fs *flag.FlagSet, args []string, lookupEnv func(string) (string, bool)) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || set[f.Name] || lookupEnv == nil {
			return
		}
		if v, ok := lookupEnv(envName(f.Name)); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %v", envName(f.Name), v, e)
			}
		}
	})
	return err
}

// splitList splits a comma-separated flag value, dropping empty items and
// surrounding spaces.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// flagsExit says how a command stops on err, an error of its flags (from
// parsing them or from what they name, as a TLS file): stop is false when
// err is nil; code is 0 for -h or --help (the usage is printed), else 2,
// with "quotient NAME: err" on env.stderr.
func flagsExit(env environment, name string, err error) (code int, stop bool) {
	switch {
	case err == nil:
		return 0, false
	case errors.Is(err, flag.ErrHelp):
		return 0, true
	}
	fmt.Fprintf(env.stderr, "quotient %s: %v\n", name, err)
	return 2, true
}
