package kafkautil

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// SASL mechanism names accepted by NewSASL (as Kafka spells them).
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// NewSASL returns the SASL mechanism of that name (PLAIN, SCRAM-SHA-256 or
// SCRAM-SHA-512, case-insensitive) for user and password, for Config.SASL.
// PLAIN sends the password as is: use it over TLS only. AWS MSK IAM is
// mskiam.Mechanism. Errors wrap ErrConfig and name what is
// wrong, never the password.
func NewSASL(mechanism, user, password string) (sasl.Mechanism, error) {
	if user == "" {
		return nil, fmt.Errorf("%w: SASL %s: the user name is empty", ErrConfig, mechanism)
	}
	if password == "" {
		return nil, fmt.Errorf("%w: SASL %s: the password is empty", ErrConfig, mechanism)
	}
	switch strings.ToUpper(mechanism) {
	case SASLPlain:
		return plain.Mechanism{Username: user, Password: password}, nil
	case SASLScramSHA256:
		return scramMechanism(scram.SHA256, user, password)
	case SASLScramSHA512:
		return scramMechanism(scram.SHA512, user, password)
	}
	return nil, fmt.Errorf("%w: SASL mechanism %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", ErrConfig, mechanism)
}

func scramMechanism(algo scram.Algorithm, user, password string) (sasl.Mechanism, error) {
	m, err := scram.Mechanism(algo, user, password)
	if err != nil {
		return nil, fmt.Errorf("%w: SASL %s: %v", ErrConfig, algo.Name(), err)
	}
	return m, nil
}

// ErrAuth wraps a refused SASL authentication (wrong user or password, or
// a mechanism the brokers do not enable).
var ErrAuth = errors.New("kafkautil: authentication refused")

// Check connects to the first bootstrap broker that answers, in two steps
// on connections of its own: first TLS alone (so a TLS failure is reported
// as such), then TLS and SASL (so a failure there is the authentication's:
// real brokers answer SaslAuthenticationFailed, some test brokers just
// close the connection), and asks for the cluster's metadata. It returns
// nil, an error wrapping ErrAuth for a refused SASL authentication, or the
// connection's error (see tlsconfig.Diagnose for what it says about TLS).
// It waits at most until ctx ends.
func (c *Cluster) Check(ctx context.Context) error {
	tlsOnly := &kafka.Dialer{ClientID: c.cfg.ClientID, Timeout: c.cfg.DialTimeout, DualStack: true, TLS: c.cfg.TLS}
	var broker string
	var err error
	for _, b := range c.cfg.Brokers {
		var conn *kafka.Conn
		if conn, err = tlsOnly.DialContext(ctx, "tcp", b); err == nil {
			// kafka-go handshakes lazily: ask for something so the
			// handshake happens on this connection.
			_, err = conn.ApiVersions()
			_ = conn.Close()
		}
		if err == nil {
			broker = b
			break
		}
		err = fmt.Errorf("kafkautil: broker %s: %w", b, err)
	}
	if broker == "" {
		return err
	}
	if c.cfg.SASL != nil {
		conn, err := c.dialer.DialContext(ctx, "tcp", broker)
		if err != nil {
			return fmt.Errorf("%w: broker %s: SASL %s: %v", ErrAuth, broker, c.cfg.SASL.Name(), err)
		}
		_ = conn.Close()
	}
	t := &kafka.Transport{DialTimeout: c.cfg.DialTimeout, ClientID: c.cfg.ClientID, TLS: c.cfg.TLS, SASL: c.cfg.SASL}
	defer t.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(broker), Timeout: c.cfg.RequestTimeout, Transport: t}
	if _, err := client.Metadata(ctx, &kafka.MetadataRequest{}); err != nil {
		return fmt.Errorf("kafkautil: broker %s: metadata: %w", broker, err)
	}
	return nil
}
