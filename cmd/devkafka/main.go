// Command devkafka runs an in-process Kafka-protocol broker
// (github.com/twmb/franz-go/pkg/kfake) on loopback, for development and
// tests only: it keeps everything in memory and is not Kafka. It is its own
// binary so that kfake is never linked into the
// quotient product binary; nothing may import this package.
//
//	devkafka --listen 127.0.0.1:9092 [--partitions N]
//	         [--tls-cert FILE --tls-key FILE]
//	         [--sasl SCRAM-SHA-512 --sasl-user NAME --sasl-password-file FILE]
//	         [--drop-produce P] [--duplicate-produce Q] [--fault-topic T] [--fault-seed N]
//
// With --tls-cert and --tls-key it serves TLS only (the files are re-read
// when they change, as the coordinator's listener does); with --sasl it
// requires SASL authentication as that one user (SCRAM-SHA-512,
// SCRAM-SHA-256 or PLAIN; the password from the file or the environment
// variable DEVKAFKA_SASL_PASSWORD), so `quotient coordinator` can be run
// locally with the same --kafka-tls and --kafka-sasl settings as in
// production.
//
// With --drop-produce or --duplicate-produce it loses (acknowledges without
// storing) or duplicates (stores twice) each produce request to --fault-topic
// with that probability: the message loss and duplication of deployed-mode
// scenarios (faults.go).
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
	"strings"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/quotientlabs/quotient/internal/tlsconfig"
)

// saslPasswordEnv is read for the SASL password without --sasl-password-file.
const saslPasswordEnv = "DEVKAFKA_SASL_PASSWORD"

// securityOpts are the broker options of the TLS and SASL flags; errors
// name the flag.
func securityOpts(certFile, keyFile, mechanism, user, pwFile string, stderr io.Writer) ([]kfake.Opt, error) {
	var opts []kfake.Opt
	if certFile != "" || keyFile != "" {
		r, err := tlsconfig.NewReloader(tlsconfig.Server{CertFile: certFile, KeyFile: keyFile}, func(err error) {
			fmt.Fprintln(stderr, "devkafka: TLS reload failed, keeping the last good certificate:", err)
		})
		if err != nil {
			return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
		opts = append(opts, kfake.TLS(r.TLSConfig()))
	}
	if mechanism == "" {
		if user != "" || pwFile != "" {
			return nil, errors.New("--sasl-user and --sasl-password-file need --sasl")
		}
		return opts, nil
	}
	m := strings.ToUpper(mechanism)
	if m != "SCRAM-SHA-512" && m != "SCRAM-SHA-256" && m != "PLAIN" {
		return nil, fmt.Errorf("--sasl %q: want SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN", mechanism)
	}
	if user == "" {
		return nil, fmt.Errorf("--sasl %s needs --sasl-user", m)
	}
	pw, err := tlsconfig.Secret{File: pwFile, Env: saslPasswordEnv}.Read(nil)
	if err != nil {
		return nil, fmt.Errorf("--sasl-password-file: %w", err)
	}
	if pw == "" {
		return nil, fmt.Errorf("--sasl %s needs a password: --sasl-password-file or $%s", m, saslPasswordEnv)
	}
	return append(opts, kfake.EnableSASL(), kfake.Superuser(m, user, pw)), nil
}

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
	certFile := fs.String("tls-cert", "", "serve TLS only with this PEM certificate (with --tls-key)")
	keyFile := fs.String("tls-key", "", "PEM key of --tls-cert")
	mechanism := fs.String("sasl", "", "require SASL: SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN (with --sasl-user)")
	user := fs.String("sasl-user", "", "the one SASL user")
	pwFile := fs.String("sasl-password-file", "", "file holding the SASL user's password (default: $"+saslPasswordEnv+")")
	var faults produceFaults
	fs.Float64Var(&faults.drop, "drop-produce", 0, "probability that a produce request is acknowledged and not stored (a lost message)")
	fs.Float64Var(&faults.duplicate, "duplicate-produce", 0, "probability that a produce request is stored twice (a duplicated message)")
	fs.StringVar(&faults.topic, "fault-topic", "", "lose and duplicate only produce requests to this topic (default: every topic)")
	fs.Uint64Var(&faults.seed, "fault-seed", 1, "seed of the loss and duplication draws")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := faults.validate(); err != nil {
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
	opts := []kfake.Opt{
		kfake.Ports(port),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			return net.Listen(network, net.JoinHostPort(host, strconv.Itoa(port)))
		}),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(*partitions),
	}
	sec, err := securityOpts(*certFile, *keyFile, *mechanism, *user, *pwFile, stderr)
	if err != nil {
		return err
	}
	c, err := kfake.NewCluster(append(opts, sec...)...)
	if err != nil {
		return fmt.Errorf("start broker on %s: %w", *listen, err)
	}
	defer c.Close()
	if faults.active() {
		stopFaults, err := faults.install(c, c.ListenAddrs()[0], stderr)
		if err != nil {
			return err
		}
		defer stopFaults()
	}
	for _, addr := range c.ListenAddrs() {
		fmt.Fprintln(stdout, addr)
	}
	<-ctx.Done()
	return nil
}
