package main

import (
	"fmt"
	"io"
	"net"
)

// openListeners opens a command's TCP listeners: metricsListen's first,
// unless it is empty (metricsLn is nil then), then listen's. An error
// names the flag and leaves nothing open. Once both are open it prints
// their addresses on out, "quotient NAME: metrics on ADDR" and "quotient
// NAME: listening on ADDR" (scripts and tests read them).
func openListeners(out io.Writer, name, listen, metricsListen string) (ln, metricsLn net.Listener, err error) {
	if metricsListen != "" {
		if metricsLn, err = net.Listen("tcp", metricsListen); err != nil {
			return nil, nil, fmt.Errorf("--metrics-listen: %w", err)
		}
	}
	if ln, err = net.Listen("tcp", listen); err != nil {
		if metricsLn != nil {
			_ = metricsLn.Close()
		}
		return nil, nil, fmt.Errorf("--listen: %w", err)
	}
	if metricsLn != nil {
		fmt.Fprintf(out, "quotient %s: metrics on %s\n", name, metricsLn.Addr())
	}
	fmt.Fprintf(out, "quotient %s: listening on %s\n", name, ln.Addr())
	return ln, metricsLn, nil
}
