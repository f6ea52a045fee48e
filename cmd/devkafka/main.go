// Command devkafka runs an in-process Kafka-protocol broker
// (github.com/twmb/franz-go/pkg/kfake) on loopback, for development and
// tests only: it keeps everything in memory, has no security and is not
// Kafka. It is its own binary so that kfake is never linked into the
// quotient product binary; nothing may import this package.
//
//	devkafka --listen 127.0.0.1:9092 [--partitions N]
//
// It prints the address it listens on and runs until SIGINT or SIGTERM.
// Topics are created on first use (auto-creation on) with N partitions
// (default 3); Quotient's clients also create their topics explicitly.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "devkafka:", err)
		os.Exit(2)
	}
}

// run starts the broker, prints its address to stdout and blocks until ctx
// ends.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("devkafka", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:9092", "host:port to listen on (port 0 picks a free port)")
	partitions := fs.Int("partitions", 3, "partitions of auto-created topics (>= 1)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *partitions < 1 {
		return fmt.Errorf("--partitions %d: want at least 1", *partitions)
	}
	host, portStr, err := net.SplitHostPort(*listen)
	if err != nil {
		return fmt.Errorf("--listen %q: want host:port: %w", *listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return fmt.Errorf("--listen %q: port %q is not a number in 0..65535", *listen, portStr)
	}
	c, err := kfake.NewCluster(
		kfake.Ports(port),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			return net.Listen(network, net.JoinHostPort(host, strconv.Itoa(port)))
		}),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(*partitions),
	)
	if err != nil {
		return fmt.Errorf("start broker on %s: %w", *listen, err)
	}
	defer c.Close()
	for _, addr := range c.ListenAddrs() {
		fmt.Fprintln(stdout, addr)
	}
	<-ctx.Done()
	return nil
}
