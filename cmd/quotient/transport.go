package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/segmentio/kafka-go/sasl"

	"github.com/quotientlabs/quotient/internal/kafkautil"
	"github.com/quotientlabs/quotient/internal/kafkautil/mskiam"
	"github.com/quotientlabs/quotient/internal/redisconn"
	"github.com/quotientlabs/quotient/internal/tlsconfig"
)

// Secrets come from a file (a --*-file flag) or from these environment
// variables, never from a flag value, which `ps` would show. They are not
// flags, so deploy/terraform passes them as ECS secrets
// (terraform_env_test.go knows them).
const (
	envRedisPassword     = "QUOTIENT_REDIS_PASSWORD"
	envKafkaSASLPassword = "QUOTIENT_KAFKA_SASL_PASSWORD"
)

// secretEnv are the environment variables read as secrets.
var secretEnv = []string{envRedisPassword, envKafkaSASLPassword}

// startupCheckTimeout bounds the start-up check of Redis and Kafka: a
// misconfiguration is one line and exit status 1 within it, an outage a
// warning (the process starts; /readyz says not ready).
const startupCheckTimeout = 10 * time.Second

// redisSecurity are the TLS and AUTH flags of a Redis client, the same in
// every command that talks to Redis.
type redisSecurity struct {
	tls bool
	clientTLS
	user, passwordFile string
}

func (r *redisSecurity) register(fs *flag.FlagSet) {
	r.flag = "redis"
	fs.BoolVar(&r.tls, "redis-tls", false, "speak TLS to Redis (implied by rediss:// addresses; ElastiCache with in-transit encryption needs it)")
	fs.StringVar(&r.ca, "redis-tls-ca", "", "PEM bundle of the CAs Redis's certificate must chain to (default: the system's roots, which ElastiCache's chain to)")
	fs.StringVar(&r.serverName, "redis-tls-server-name", "", "name Redis's certificate must carry (default: the host of each address)")
	fs.StringVar(&r.cert, "redis-tls-cert", "", "PEM client certificate for Redis servers that require one (with --redis-tls-key)")
	fs.StringVar(&r.key, "redis-tls-key", "", "PEM key of --redis-tls-cert")
	fs.StringVar(&r.user, "redis-user", "", "Redis ACL user (ElastiCache RBAC); default: the default user")
	fs.StringVar(&r.passwordFile, "redis-password-file", "", "file holding the Redis password or AUTH token (default: the environment variable "+envRedisPassword+"; never a flag value, which ps shows)")
}

// options checks the flags and builds the client options for the
// comma-separated addresses list; errors name the flag.
func (r *redisSecurity) options(list string, cluster bool, lookupEnv func(string) (string, bool)) (redisconn.Options, error) {
	addrs, useTLS, user, err := redisconn.ParseAddrs(splitList(list))
	if err != nil {
		return redisconn.Options{}, fmt.Errorf("--redis: %w", err)
	}
	o := redisconn.Options{Addrs: addrs, Cluster: cluster, Username: r.user}
	if user != "" {
		if r.user != "" && r.user != user {
			return o, fmt.Errorf("--redis names user %q and --redis-user %q: give one", user, r.user)
		}
		o.Username = user
	}
	if useTLS || r.tls {
		if o.TLS, err = r.tlsConfig(); err != nil {
			return o, err
		}
	} else if r.given() {
		return o, errors.New("--redis-tls-ca, --redis-tls-server-name, --redis-tls-cert and --redis-tls-key need --redis-tls (or rediss:// addresses)")
	}
	if o.Password, err = (tlsconfig.Secret{File: r.passwordFile, Env: envRedisPassword}).Read(lookupEnv); err != nil {
		return o, fmt.Errorf("--redis-password-file: %w", err)
	}
	if o.Username != "" && o.Password == "" {
		return o, fmt.Errorf("--redis-user %q needs a password: --redis-password-file or %s", o.Username, envRedisPassword)
	}
	return o, nil
}

// clientTLS are the TLS settings of one kind of client connection, the
// flags --F-tls-ca, --F-tls-server-name, --F-tls-cert and --F-tls-key for
// F = flag (redis, kafka, upstream). Each command registers them with its
// own usage texts.
type clientTLS struct {
	flag                      string // the flags' prefix, set by register
	ca, serverName, cert, key string
}

// given reports whether any of the settings is set.
func (c *clientTLS) given() bool {
	return c.ca != "" || c.serverName != "" || c.cert != "" || c.key != ""
}

// tlsConfig reads the files (once: a client certificate rotates with a
// restart) and returns the client configuration; errors name the flag.
func (c *clientTLS) tlsConfig() (*tls.Config, error) {
	cfg, err := (tlsconfig.Client{CAFile: c.ca, ServerName: c.serverName, CertFile: c.cert, KeyFile: c.key}).Config()
	if err != nil {
		f := "--" + c.flag + "-tls-"
		return nil, fmt.Errorf("%s: %w", blameFile(err, map[string]string{c.ca: f + "ca", c.cert: f + "cert", c.key: f + "key"}, f+"cert/"+f+"key"), err)
	}
	return cfg, nil
}

// blame names the setting a failed connection's error points at, and
// why, or "" when it is not a TLS failure (see tlsBlame); useTLS says
// whether the connection spoke TLS, tlsSetting what turns TLS on.
func (c *clientTLS) blame(err error, useTLS bool, tlsSetting string) (string, string) {
	f := "--" + c.flag + "-tls-"
	return tlsBlame(err, useTLS, tlsSetting, f+"ca", f+"server-name", f+"cert/"+f+"key")
}

// blameFile returns the flag whose file the error names, or fallback when
// it names none or several (a certificate that does not match its key
// names both files; the map's order must not pick one).
func blameFile(err error, files map[string]string, fallback string) string {
	msg := err.Error()
	blamed := ""
	for file, name := range files {
		if file != "" && strings.Contains(msg, file) {
			if blamed != "" && blamed != name {
				return fallback
			}
			blamed = name
		}
	}
	if blamed == "" {
		return fallback
	}
	return blamed
}

// checkRedis connects once to Redis with o (bounded by
// startupCheckTimeout): a refused AUTH or a TLS failure is an error that
// names the setting to fix; an outage is a warning on log, and nil.
func checkRedis(ctx context.Context, o redisconn.Options, r *redisSecurity, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, startupCheckTimeout)
	defer cancel()
	err := o.Check(ctx)
	if err == nil {
		return nil
	}
	if errors.Is(err, redisconn.ErrAuth) {
		who := "the default user"
		if o.Username != "" {
			who = fmt.Sprintf("user %q (--redis-user)", o.Username)
		}
		src := envRedisPassword
		if r.passwordFile != "" {
			src = "--redis-password-file " + r.passwordFile
		}
		return fmt.Errorf("%s: Redis refused AUTH as %s: %v", src, who, err)
	}
	if name, why := r.blame(err, o.TLS != nil, "--redis-tls"); name != "" {
		return fmt.Errorf("%s: Redis %v: %s: %v", name, o.Addrs, why, err)
	}
	log.Warn("Redis does not answer at start; continuing (not ready until it does)", "redis", o.Addrs, "err", err)
	return nil
}

// tlsBlame names the setting a TLS failure points at, or "" when err is
// not one (an outage).
func tlsBlame(err error, useTLS bool, tlsFlag, caFlag, nameFlag, certFlag string) (string, string) {
	switch cause := tlsconfig.Diagnose(err); cause {
	case tlsconfig.CauseUnknownAuthority:
		return caFlag, cause.String()
	case tlsconfig.CauseServerName:
		return nameFlag, cause.String()
	case tlsconfig.CauseNotTLS:
		return tlsFlag, cause.String() + ": drop " + tlsFlag + " or use the server's TLS port"
	case tlsconfig.CauseClientCert:
		return certFlag, cause.String()
	case tlsconfig.CauseClosed:
		if !useTLS {
			return tlsFlag, cause.String() + ": set " + tlsFlag
		}
	}
	return "", ""
}

// mskIAM is the --kafka-sasl value of AWS MSK IAM access control.
const mskIAM = "AWS_MSK_IAM"

// kafkaSecurity are the TLS and SASL flags of the Kafka clients.
type kafkaSecurity struct {
	tls bool
	clientTLS
	mechanism, user, pwFile string
	awsRegion               string
}

func (k *kafkaSecurity) register(fs *flag.FlagSet) {
	k.flag = "kafka"
	fs.BoolVar(&k.tls, "kafka-tls", false, "speak TLS to the Kafka brokers (MSK's TLS listener, port 9094; SASL/SCRAM on MSK is port 9096)")
	fs.StringVar(&k.ca, "kafka-tls-ca", "", "PEM bundle of the CAs the brokers' certificates must chain to (default: the system's roots, which MSK's chain to)")
	fs.StringVar(&k.serverName, "kafka-tls-server-name", "", "name the brokers' certificates must carry (default: each broker's host)")
	fs.StringVar(&k.cert, "kafka-tls-cert", "", "PEM client certificate for brokers that authenticate clients by TLS (with --kafka-tls-key)")
	fs.StringVar(&k.key, "kafka-tls-key", "", "PEM key of --kafka-tls-cert")
	fs.StringVar(&k.mechanism, "kafka-sasl", "", "SASL mechanism: SCRAM-SHA-512, SCRAM-SHA-256, PLAIN (PLAIN only with --kafka-tls) or AWS_MSK_IAM (MSK IAM access control, port 9098, with --kafka-tls; credentials from the AWS default chain, e.g. the ECS task role); empty: no SASL")
	fs.StringVar(&k.awsRegion, "kafka-aws-region", "", "AWS region of the MSK cluster, for --kafka-sasl AWS_MSK_IAM (default: $AWS_REGION)")
	fs.StringVar(&k.user, "kafka-sasl-user", "", "SASL user name (with --kafka-sasl)")
	fs.StringVar(&k.pwFile, "kafka-sasl-password-file", "", "file holding the SASL password (default: the environment variable "+envKafkaSASLPassword+")")
}

// config checks the flags and returns the TLS configuration and SASL
// mechanism (each nil when off); errors name the flag.
func (k *kafkaSecurity) config(lookupEnv func(string) (string, bool)) (*tls.Config, sasl.Mechanism, error) {
	var cfg *tls.Config
	var err error
	if k.tls {
		if cfg, err = k.tlsConfig(); err != nil {
			return nil, nil, err
		}
	} else if k.given() {
		return nil, nil, errors.New("--kafka-tls-ca, --kafka-tls-server-name, --kafka-tls-cert and --kafka-tls-key need --kafka-tls")
	}
	if k.mechanism == "" {
		if k.user != "" || k.pwFile != "" {
			return nil, nil, errors.New("--kafka-sasl-user and --kafka-sasl-password-file need --kafka-sasl")
		}
		return cfg, nil, nil
	}
	if !k.tls && (k.mechanism == "PLAIN" || k.mechanism == "plain") {
		return nil, nil, errors.New("--kafka-sasl PLAIN sends the password in the clear: it needs --kafka-tls")
	}
	if strings.EqualFold(k.mechanism, mskIAM) {
		switch {
		case !k.tls:
			return nil, nil, errors.New("--kafka-sasl AWS_MSK_IAM needs --kafka-tls: MSK serves IAM on its TLS port 9098")
		case k.user != "" || k.pwFile != "":
			return nil, nil, errors.New("--kafka-sasl AWS_MSK_IAM takes no --kafka-sasl-user or password: it signs with the AWS credentials")
		}
		region := k.awsRegion
		if region == "" && lookupEnv != nil {
			region, _ = lookupEnv("AWS_REGION")
		}
		if region == "" {
			return nil, nil, errors.New("--kafka-sasl AWS_MSK_IAM needs --kafka-aws-region (or AWS_REGION)")
		}
		return cfg, mskiam.Mechanism{Region: region}, nil
	}
	pw, err := tlsconfig.Secret{File: k.pwFile, Env: envKafkaSASLPassword}.Read(lookupEnv)
	if err != nil {
		return nil, nil, fmt.Errorf("--kafka-sasl-password-file: %w", err)
	}
	if k.user == "" {
		return nil, nil, fmt.Errorf("--kafka-sasl %s needs --kafka-sasl-user", k.mechanism)
	}
	if pw == "" {
		return nil, nil, fmt.Errorf("--kafka-sasl %s needs a password: --kafka-sasl-password-file or %s", k.mechanism, envKafkaSASLPassword)
	}
	m, err := kafkautil.NewSASL(k.mechanism, k.user, pw)
	if err != nil {
		return nil, nil, fmt.Errorf("--kafka-sasl: %w", err)
	}
	return cfg, m, nil
}

// checkKafka connects once to the brokers (bounded by
// startupCheckTimeout): a refused SASL authentication or a TLS failure is
// an error that names the setting; an outage is a warning, and nil.
func checkKafka(ctx context.Context, brokers []string, tlsCfg *tls.Config, mech sasl.Mechanism, k *kafkaSecurity, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, startupCheckTimeout)
	defer cancel()
	kcfg := kafkautil.DefaultConfig(brokers...)
	kcfg.TLS, kcfg.SASL = tlsCfg, mech
	cl, err := kafkautil.New(kcfg)
	if err != nil {
		return fmt.Errorf("--kafka: %w", err)
	}
	defer cl.Close()
	err = cl.Check(ctx)
	if err == nil {
		return nil
	}
	if errors.Is(err, kafkautil.ErrAuth) && strings.EqualFold(k.mechanism, mskIAM) {
		return fmt.Errorf("--kafka-sasl AWS_MSK_IAM: Kafka refused the IAM authentication (the AWS credentials or their kafka-cluster:Connect permission): %v", err)
	}
	if errors.Is(err, kafkautil.ErrAuth) {
		src := envKafkaSASLPassword
		if k.pwFile != "" {
			src = "--kafka-sasl-password-file " + k.pwFile
		}
		return fmt.Errorf("--kafka-sasl-user %q / %s: Kafka refused SASL %s authentication: %v", k.user, src, mech.Name(), err)
	}
	if name, why := k.blame(err, tlsCfg != nil, "--kafka-tls"); name != "" {
		return fmt.Errorf("%s: Kafka %v: %s: %v", name, brokers, why, err)
	}
	log.Warn("Kafka does not answer at start; continuing (not ready until it does)", "kafka", brokers, "err", err)
	return nil
}

// listenSecurity are the TLS flags of the coordinator's HTTP listener, of
// quotient rls's gRPC and metrics listeners and of quotient gateway's
// proxy and metrics listeners.
type listenSecurity struct {
	cert, key, clientCA string
	adminClientCert     bool
	adminInsecure       bool
	// requireClientCert makes the handshake fail without a client
	// certificate verified by clientCA (quotient rls, whose every caller
	// must present one); false: verified if given (the coordinator, whose
	// handler decides per path). Set by the command, not a flag.
	requireClientCert bool
}

func (l *listenSecurity) register(fs *flag.FlagSet) {
	fs.StringVar(&l.cert, "listen-tls-cert", "", "serve --listen over TLS only with this PEM certificate (chain); re-read when it changes, so certificates rotate without a restart")
	fs.StringVar(&l.key, "listen-tls-key", "", "PEM key of --listen-tls-cert (re-read with it)")
	fs.StringVar(&l.clientCA, "listen-tls-client-ca", "", "PEM bundle of the CAs whose client certificates the listener verifies (re-read when it changes)")
	fs.BoolVar(&l.adminClientCert, "admin-client-cert", false, "the admin API requires a client certificate verified by --listen-tls-client-ca, besides its bearer token (/metrics and the health endpoints do not)")
	fs.BoolVar(&l.adminInsecure, "admin-insecure", false, "allow the admin API on a non-loopback --listen without TLS (its bearer tokens then cross the network in the clear)")
}

// registerRequired registers the listener TLS flags of a command without
// an admin API whose every client must present a certificate verified by
// --listen-tls-client-ca when it is set (quotient gateway); served says
// what the listeners serve, for the usage texts.
func (l *listenSecurity) registerRequired(fs *flag.FlagSet, served string) {
	fs.StringVar(&l.cert, "listen-tls-cert", "", "serve "+served+" over TLS only, with this PEM certificate (chain); re-read when it changes, so certificates rotate without a restart")
	fs.StringVar(&l.key, "listen-tls-key", "", "PEM key of --listen-tls-cert (re-read with it)")
	fs.StringVar(&l.clientCA, "listen-tls-client-ca", "", "PEM bundle of CAs: every client of "+served+" must present a certificate that chains to one (mutual TLS; re-read when it changes); needs --listen-tls-cert")
	l.requireClientCert = true
}

// check returns an error naming the flags when they do not go together
// (it reads no file: reloader does).
func (l *listenSecurity) check() error {
	switch {
	case l.cert == "" && l.key == "":
		switch {
		case l.adminClientCert:
			return errors.New("--listen-tls-client-ca and --admin-client-cert need --listen-tls-cert and --listen-tls-key")
		case l.clientCA != "":
			return errors.New("--listen-tls-client-ca needs --listen-tls-cert and --listen-tls-key: client certificates are verified in a TLS handshake")
		}
	case l.cert == "" || l.key == "":
		return errors.New("--listen-tls-cert and --listen-tls-key go together")
	case l.adminClientCert && l.clientCA == "":
		return errors.New("--admin-client-cert needs --listen-tls-client-ca: the CAs the client certificates must chain to")
	}
	return nil
}

// reloader returns the listener's TLS (nil without --listen-tls-cert);
// reload failures after start are logged. Errors name the flag.
func (l *listenSecurity) reloader(log *slog.Logger, nextProtos ...string) (*tlsconfig.Reloader, error) {
	if err := l.check(); err != nil || l.cert == "" {
		return nil, err
	}
	r, err := tlsconfig.NewReloader(tlsconfig.Server{CertFile: l.cert, KeyFile: l.key, ClientCAFile: l.clientCA, RequireClientCert: l.requireClientCert && l.clientCA != ""}, func(err error) {
		log.Error("listener TLS: reload failed; serving the last good certificate", "err", err)
	}, nextProtos...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", blameFile(err, map[string]string{l.cert: "--listen-tls-cert", l.key: "--listen-tls-key", l.clientCA: "--listen-tls-client-ca"}, "--listen-tls-cert/--listen-tls-key"), err)
	}
	return r, nil
}

// upstreamSecurity are quotient gateway's TLS flags for its upstream: an
// https:// --upstream is verified against --upstream-tls-ca (default the
// system's roots) for --upstream-tls-server-name (default the URL's
// host), and presents --upstream-tls-cert to an upstream that requires a
// client certificate.
type upstreamSecurity struct {
	clientTLS
}

func (u *upstreamSecurity) register(fs *flag.FlagSet) {
	u.flag = "upstream"
	fs.StringVar(&u.ca, "upstream-tls-ca", "", "PEM bundle of the CAs an https:// --upstream's certificate must chain to (default: the system's roots)")
	fs.StringVar(&u.serverName, "upstream-tls-server-name", "", "name the https:// --upstream's certificate must carry (default: the URL's host)")
	fs.StringVar(&u.cert, "upstream-tls-cert", "", "PEM client certificate for an https:// --upstream that requires one (with --upstream-tls-key; read at start: rotating it takes a restart)")
	fs.StringVar(&u.key, "upstream-tls-key", "", "PEM key of --upstream-tls-cert")
}

// transport returns the round tripper to the upstream: http.DefaultTransport's
// settings (connection pooling, proxy from the environment, HTTP/2 over
// TLS) with these TLS settings. Without any of them it is nil, and the
// proxy uses http.DefaultTransport. Errors name the flag: TLS settings
// with an http:// upstream, or a file that does not load.
func (u *upstreamSecurity) transport(upstream *url.URL) (http.RoundTripper, error) {
	if !u.given() {
		return nil, nil
	}
	if upstream.Scheme != "https" {
		return nil, fmt.Errorf("--upstream-tls-ca, --upstream-tls-server-name, --upstream-tls-cert and --upstream-tls-key need an https:// --upstream, got %q", upstream.String())
	}
	cfg, err := u.tlsConfig()
	if err != nil {
		return nil, err
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = cfg
	return t, nil
}
