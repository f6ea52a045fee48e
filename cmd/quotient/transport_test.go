package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/internal/tlsconfig/tlstest"
)

// secureParts are the real parts of a secured deployment on loopback: one
// CA, region a's Redis (standalone, TLS only, password and an ACL user),
// region b's Redis (a three-node TLS cluster that requires client
// certificates and a password) and one kfake broker with TLS and SASL
// SCRAM-SHA-512.
type secureParts struct {
	ca         *tlstest.CA
	redisA     *redistest.Server
	redisB     *redistest.Cluster
	clientPair tlstest.Pair // for Redis b
	listenPair tlstest.Pair // the coordinators' listener
	kafka      string
	dir        string
}

const (
	redisAUser, redisAPassword = "quotient", "acl-pw-a"
	redisBPassword             = "auth-token-b"
	kafkaUser, kafkaPassword   = "coordinator", "scram-pw"
)

func startSecureParts(t *testing.T) *secureParts {
	t.Helper()
	p := &secureParts{ca: tlstest.NewCA(t, "quotient"), dir: t.TempDir()}
	a := p.ca.Server(t, "redis-a")
	node := p.ca.Both(t, "redis-b")
	p.clientPair = p.ca.Client(t, "coordinator-client")
	p.listenPair = p.ca.Server(t, "coordinator")
	p.redisA = redistest.StartServer(t, redistest.WithTLS(redistest.TLS{CertFile: a.CertFile, KeyFile: a.KeyFile, CAFile: p.ca.CertFile}),
		redistest.WithPassword("default-pw-a"), redistest.WithArgs("--user", redisAUser, "on", ">"+redisAPassword, "~*", "&*", "+@all"))
	p.redisB = redistest.StartCluster(t, redistest.WithTLS(redistest.TLS{CertFile: node.CertFile, KeyFile: node.KeyFile, CAFile: p.ca.CertFile,
		ClientCertFile: p.clientPair.CertFile, ClientKeyFile: p.clientPair.KeyFile}), redistest.WithPassword(redisBPassword))
	broker := p.ca.Server(t, "kafka")
	cert, err := tls.LoadX509KeyPair(broker.CertFile, broker.KeyFile)
	require.NoError(t, err)
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.TLS(&tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}),
		kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", kafkaUser, kafkaPassword), kfake.AllowAutoTopicCreation())
	require.NoError(t, err)
	t.Cleanup(kc.Close)
	p.kafka = kc.ListenAddrs()[0]
	return p
}

// coordinatorVars are the environment of region r's coordinator, as
// deploy/terraform passes it: settings as QUOTIENT_* variables, the Redis
// password as the secret variable, the SASL password in a file.
func (p *secureParts) coordinatorVars(t *testing.T, r, listen, policies string) map[string]string {
	v := map[string]string{
		"QUOTIENT_REGION": r, "QUOTIENT_REGIONS": "a,b", "QUOTIENT_EPOCH": "1s", "QUOTIENT_POLICIES": policies,
		"QUOTIENT_LISTEN": listen, "QUOTIENT_LISTEN_TLS_CERT": p.listenPair.CertFile, "QUOTIENT_LISTEN_TLS_KEY": p.listenPair.KeyFile,
		"QUOTIENT_KAFKA": p.kafka, "QUOTIENT_KAFKA_TLS": "true", "QUOTIENT_KAFKA_TLS_CA": p.ca.CertFile,
		"QUOTIENT_KAFKA_SASL": "SCRAM-SHA-512", "QUOTIENT_KAFKA_SASL_USER": kafkaUser,
		"QUOTIENT_KAFKA_SASL_PASSWORD_FILE": gwFile(t, p.dir, "kafka-pw-"+r, kafkaPassword+"\n"),
		"QUOTIENT_REDIS_TLS_CA":             p.ca.CertFile,
	}
	if r == "a" {
		v["QUOTIENT_REDIS"] = "rediss://" + redisAUser + "@" + p.redisA.Addr()
		v[envRedisPassword] = redisAPassword
	} else {
		v["QUOTIENT_REDIS"] = strings.Join(p.redisB.Addrs(), ",")
		v["QUOTIENT_REDIS_TLS"] = "true"
		v["QUOTIENT_REDIS_TLS_CERT"], v["QUOTIENT_REDIS_TLS_KEY"] = p.clientPair.CertFile, p.clientPair.KeyFile
		v[envRedisPassword] = redisBPassword
	}
	return v
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// runCoordinatorProc runs `quotient coordinator` with vars as its
// environment until the test ends, and checks it exits 0 then.
func runCoordinatorProc(t *testing.T, vars map[string]string) *syncBuffer {
	env, errb := coordinatorEnvOf(vars)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- run(ctx, env, []string{"coordinator"}) }()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			assert.Equal(t, 0, code, errb.String())
		case <-time.After(30 * time.Second):
			t.Error("coordinator did not stop within 30 s")
		}
	})
	return errb
}

// metric returns the sum of the samples of the metric lines that start
// with prefix in a Prometheus text exposition.
func metric(body, prefix string) float64 {
	var sum float64
	for line := range strings.SplitSeq(body, "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// TestTransportSecurityEndToEnd: two regions, every connection secured
// and configured as an operator would (environment variables, a secret
// variable, a password file, rediss://): region a's coordinator and
// gateway use a TLS Redis as an ACL user, region b's coordinator a TLS
// Redis Cluster with client certificates and an AUTH token; the
// coordinators exchange reports over Kafka with TLS and SASL SCRAM-SHA-512
// and serve /metrics over TLS. The gateway decides (its global policy's
// share is enforced in Redis over TLS) and the coordinators accept each
// other's reports and write shares.
func TestTransportSecurityEndToEnd(t *testing.T) {
	p := startSecureParts(t)
	policies := writePolicies(t, `[{"id":"g","match":{"tier":"pro"},"algorithm":"token_bucket","rate_per_sec":2,"burst":4,"scope":"global"}]`)
	listenA, listenB := freeAddr(t), freeAddr(t)
	errA := runCoordinatorProc(t, p.coordinatorVars(t, "a", listenA, policies))
	errB := runCoordinatorProc(t, p.coordinatorVars(t, "b", listenB, policies))

	up := upstream(t)
	base, gwErr, _ := startGateway(t, "--upstream", up.URL, "--redis", "rediss://"+p.redisA.Addr(), "--redis-tls-ca", p.ca.CertFile,
		"--redis-user", redisAUser, "--redis-password-file", gwFile(t, p.dir, "gw-pw", redisAPassword),
		"--policies", policies, "--keys", gwFile(t, p.dir, "k.json", gatewayKeys), "--timeout", "1s", "--region", "a", "--regions", "a,b", "--epoch", "1s")

	https := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: p.ca.ClientConfig(t, nil)}}
	scrape := func(addr string) string {
		resp, err := https.Get("https://" + addr + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	c := &http.Client{Timeout: 10 * time.Second}
	var codes []int
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, _ := get(t, c, base+"/v1/orders", map[string]string{"X-API-Key": "k1"})
		codes = append(codes, resp.StatusCode)
		a, b := scrape(listenA), scrape(listenB)
		shares, err := p.redisA.Client().Keys(t.Context(), "rl:{*}:g:share").Result()
		require.NoError(t, err)
		if metric(a, `quotient_coordinator_reports_total{receipt="accepted",region="b"}`) > 0 &&
			metric(b, `quotient_coordinator_reports_total{receipt="accepted",region="a"}`) > 0 && len(shares) > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "no report exchange and share within 60 s\na: %s\nb: %s\ngateway: %s", errA, errB, gwErr)
		time.Sleep(200 * time.Millisecond) // pacing the traffic; the loop ends on the condition or the deadline
	}
	assert.Contains(t, codes, http.StatusOK)
	assert.Contains(t, codes, http.StatusTooManyRequests, "the global limit's share is enforced: %v", codes)
	assert.NotContains(t, errA.String()+errB.String(), "does not answer at start")
}

var exitLine = regexp.MustCompile(`(?m)^quotient coordinator: .*$`)

// TestCoordinatorStartupMisconfiguration: each misconfiguration of a
// secured connection ends `quotient coordinator` at start, within the
// start-up check's bound, with one line that names the setting to fix.
func TestCoordinatorStartupMisconfiguration(t *testing.T) {
	p := startSecureParts(t)
	policies := writePolicies(t, globalPolicy)
	other := tlstest.NewCA(t, "other")
	for _, tc := range []struct {
		name   string
		change map[string]string
		code   int
		want   []string
	}{
		{"wrong Redis CA", map[string]string{"QUOTIENT_REDIS_TLS_CA": other.CertFile}, 1, []string{"--redis-tls-ca", "not trusted by the CA bundle"}},
		{"wrong Redis password", map[string]string{envRedisPassword: "nope"}, 1, []string{envRedisPassword, "refused AUTH", `user "quotient"`}},
		{"wrong Redis password file", map[string]string{"QUOTIENT_REDIS_PASSWORD_FILE": gwFile(t, p.dir, "bad-redis-pw", "nope")}, 1, []string{"--redis-password-file", "refused AUTH"}},
		{"Redis without TLS", map[string]string{"QUOTIENT_REDIS": p.redisA.Addr(), "QUOTIENT_REDIS_TLS_CA": "", "QUOTIENT_REDIS_USER": redisAUser}, 1, []string{"--redis-tls:", "closed the connection"}},
		{"wrong Redis server name", map[string]string{"QUOTIENT_REDIS_TLS_SERVER_NAME": "redis.example.com"}, 1, []string{"--redis-tls-server-name"}},
		{"wrong Kafka password", map[string]string{"QUOTIENT_KAFKA_SASL_PASSWORD_FILE": gwFile(t, p.dir, "bad-kafka-pw", "nope")}, 1, []string{"--kafka-sasl-user", "refused SASL SCRAM-SHA-512"}},
		{"wrong Kafka CA", map[string]string{"QUOTIENT_KAFKA_TLS_CA": other.CertFile}, 1, []string{"--kafka-tls-ca"}},
		{"Kafka without TLS", map[string]string{"QUOTIENT_KAFKA_TLS": "false", "QUOTIENT_KAFKA_TLS_CA": ""}, 1, []string{"--kafka-tls:"}},
		{"missing listener key", map[string]string{"QUOTIENT_LISTEN_TLS_KEY": "/nonexistent/key.pem"}, 2, []string{"--listen-tls-key", "/nonexistent/key.pem"}},
		{"missing Redis CA", map[string]string{"QUOTIENT_REDIS_TLS_CA": "/nonexistent/ca.pem"}, 2, []string{"--redis-tls-ca", "/nonexistent/ca.pem"}},
		{"password in the address", map[string]string{"QUOTIENT_REDIS": "rediss://quotient:" + redisAPassword + "@" + p.redisA.Addr()}, 2, []string{"--redis", "holds a password"}},
		{"admin API in the clear", map[string]string{"QUOTIENT_LISTEN": "0.0.0.0:0", "QUOTIENT_LISTEN_TLS_CERT": "", "QUOTIENT_LISTEN_TLS_KEY": "",
			"QUOTIENT_ADMIN_TOKENS_FILE": gwFile(t, p.dir, "tokens", "ops admin 0123456789abcdef0123\n")}, 2, []string{"--listen", "--listen-tls-cert", "--admin-insecure"}},
		{"TLS files without TLS", map[string]string{"QUOTIENT_REDIS": p.redisA.Addr()}, 2, []string{"need --redis-tls"}},
		{"user without password", map[string]string{envRedisPassword: ""}, 2, []string{`--redis-user "quotient" needs a password`}},
		{"SASL without user", map[string]string{"QUOTIENT_KAFKA_SASL_USER": ""}, 2, []string{"--kafka-sasl SCRAM-SHA-512 needs --kafka-sasl-user"}},
		{"unknown SASL", map[string]string{"QUOTIENT_KAFKA_SASL": "GSSAPI"}, 2, []string{"--kafka-sasl", `"GSSAPI"`}},
		{"client CA without listener TLS", map[string]string{"QUOTIENT_LISTEN_TLS_CERT": "", "QUOTIENT_LISTEN_TLS_KEY": "", "QUOTIENT_LISTEN_TLS_CLIENT_CA": p.ca.CertFile}, 2, []string{"--listen-tls-client-ca"}},
		{"PLAIN without TLS", map[string]string{"QUOTIENT_KAFKA_TLS": "false", "QUOTIENT_KAFKA_TLS_CA": "", "QUOTIENT_KAFKA_SASL": "PLAIN"}, 2, []string{"--kafka-sasl PLAIN", "--kafka-tls"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vars := p.coordinatorVars(t, "a", "127.0.0.1:0", policies)
			maps.Copy(vars, tc.change)
			for k, v := range vars {
				if v == "" {
					delete(vars, k)
				}
			}
			env, errb := coordinatorEnvOf(vars)
			ctx, cancel := context.WithTimeout(t.Context(), startupCheckTimeout+20*time.Second)
			defer cancel()
			start := time.Now()
			code := run(ctx, env, []string{"coordinator"})
			require.NoError(t, ctx.Err(), "the coordinator ran instead of failing: %s", errb.String())
			assert.Equal(t, tc.code, code, errb.String())
			lines := exitLine.FindAllString(errb.String(), -1)
			require.Len(t, lines, 1, "one line: %s", errb.String())
			for _, w := range tc.want {
				assert.Contains(t, lines[0], w)
			}
			assert.NotContains(t, errb.String(), redisAPassword)
			assert.NotContains(t, errb.String(), kafkaPassword)
			t.Logf("%v: %s", time.Since(start).Round(time.Millisecond), lines[0])
		})
	}
}

// TestGatewayStartupMisconfiguration: the gateway fails at start, naming
// the setting, on a refused AUTH and on a Redis CA that does not match.
func TestGatewayStartupMisconfiguration(t *testing.T) {
	p := startSecureParts(t)
	up := upstream(t)
	policies := gwFile(t, p.dir, "p.json", gatewayPolicies)
	other := tlstest.NewCA(t, "other")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--redis-tls-ca", p.ca.CertFile, "--redis-password-file", gwFile(t, p.dir, "wrong", "wrong")}, "--redis-password-file"},
		{[]string{"--redis-tls-ca", other.CertFile, "--redis-password-file", gwFile(t, p.dir, "right", redisAPassword)}, "--redis-tls-ca"},
	} {
		stdout, stderr := &syncBuffer{}, &syncBuffer{}
		env := environment{stdout: stdout, stderr: stderr, lookupEnv: func(string) (string, bool) { return "", false }}
		args := append([]string{"gateway", "--listen", "127.0.0.1:0", "--upstream", up.URL, "--policies", policies,
			"--redis", fmt.Sprintf("rediss://%s@%s", redisAUser, p.redisA.Addr())}, tc.args...)
		ctx, cancel := context.WithTimeout(t.Context(), startupCheckTimeout+20*time.Second)
		code := run(ctx, env, args)
		require.NoError(t, ctx.Err(), "the gateway ran instead of failing: %s", stderr.String())
		cancel()
		assert.Equal(t, 1, code)
		assert.Contains(t, stderr.String(), tc.want)
		assert.NotContains(t, stdout.String(), "listening on")
	}
}

// TestAdminAPIOverTLSWithClientCertificates: `quotient coordinator` with
// the settings an operator passes (listener certificate and key, client
// CA, --admin-client-cert) serves the admin API over TLS; `quotient admin`
// with the CA and a client certificate reads it, without the certificate
// it gets 403, and the health check needs no certificate.
func TestAdminAPIOverTLSWithClientCertificates(t *testing.T) {
	p := startSecureParts(t)
	const tok = "admin-token-0123456789"
	operator := p.ca.Client(t, "operator")
	listen := freeAddr(t)
	vars := p.coordinatorVars(t, "a", listen, writePolicies(t, globalPolicy))
	maps.Copy(vars, map[string]string{
		"QUOTIENT_REGIONS": "a", "QUOTIENT_ADMIN_TOKENS_FILE": gwFile(t, p.dir, "tokens", "ops admin "+tok+"\n"),
		"QUOTIENT_LISTEN_TLS_CLIENT_CA": p.ca.CertFile, "QUOTIENT_ADMIN_CLIENT_CERT": "true",
	})
	errb := runCoordinatorProc(t, vars)

	https := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: p.ca.ClientConfig(t, nil)}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := https.Get("https://" + listen + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		require.True(t, time.Now().Before(deadline), "not ready over TLS within 30 s: %v\n%s", err, errb)
		time.Sleep(50 * time.Millisecond) // polling readiness against a deadline
	}
	admin := func(args ...string) (int, string, string) {
		out, e := &syncBuffer{}, &syncBuffer{}
		env := environment{stdout: out, stderr: e, lookupEnv: func(k string) (string, bool) {
			v, ok := map[string]string{"QUOTIENT_SERVER": "https://" + listen, "QUOTIENT_TOKEN": tok}[k]
			return v, ok
		}}
		code := run(t.Context(), env, append([]string{"admin"}, args...))
		return code, out.String(), e.String()
	}
	code, out, e := admin("--tls-ca", p.ca.CertFile, "--tls-cert", operator.CertFile, "--tls-key", operator.KeyFile, "list")
	assert.Equal(t, 0, code, e)
	assert.Contains(t, out, "policies")
	code, _, e = admin("--tls-ca", p.ca.CertFile, "list")
	assert.NotEqual(t, 0, code)
	assert.Contains(t, e, "403")
	code, _, e = admin("list")
	assert.NotEqual(t, 0, code, "the system roots do not trust the test CA")
	assert.Contains(t, e, "certificate")
}

// TestGatewayOnTLSClusterEndpoint: the gateway given one node of a TLS
// Redis Cluster as its configuration endpoint (--redis-cluster, as for
// ElastiCache cluster mode), with a client certificate and an AUTH token
// from a file, decides against the cluster: the burst of 5 admits exactly
// 5 (a standalone client would meet MOVED for slots on other nodes and
// fall back to the in-process limit, which admits 10) and no store error.
func TestGatewayOnTLSClusterEndpoint(t *testing.T) {
	p := startSecureParts(t)
	up := upstream(t)
	base, stderr, _ := startGateway(t, "--upstream", up.URL, "--redis", "rediss://"+p.redisB.Addrs()[0], "--redis-cluster",
		"--redis-tls-ca", p.ca.CertFile, "--redis-tls-cert", p.clientPair.CertFile, "--redis-tls-key", p.clientPair.KeyFile,
		"--redis-password-file", gwFile(t, p.dir, "token", redisBPassword),
		"--policies", gwFile(t, p.dir, "p.json", gatewayPolicies), "--keys", gwFile(t, p.dir, "k.json", gatewayKeys),
		"--timeout", "1s", "--region", "b", "--regions", "a,b")
	c := &http.Client{Timeout: 10 * time.Second}
	var codes []int
	for range 8 {
		resp, _ := get(t, c, base+"/v1/orders", map[string]string{"X-API-Key": "k1"})
		codes = append(codes, resp.StatusCode)
	}
	assert.Equal(t, []int{200, 200, 200, 200, 200, 429, 429, 429}, codes, stderr.String())
	_, metrics := get(t, c, base+"/metrics", nil)
	assert.Contains(t, string(metrics), `quotient_limiter_store_errors_total{region="b"} 0`)
}

// TestCoordinatorMSKIAM: --kafka-sasl AWS_MSK_IAM signs a token with the
// AWS credentials (static ones from the environment here, no network) and
// offers SASL OAUTHBEARER; kfake only knows PLAIN and SCRAM, so the
// handshake is refused, and the coordinator says so in one line at start.
// The flag checks need TLS and a region.
func TestCoordinatorMSKIAM(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	t.Setenv("AWS_CONFIG_FILE", "/nonexistent/config")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
	p := startSecureParts(t)
	for _, tc := range []struct {
		name   string
		change map[string]string
		code   int
		want   string
	}{
		{"refused by a broker without IAM", map[string]string{"QUOTIENT_KAFKA_AWS_REGION": "eu-west-1"}, 1, "--kafka-sasl AWS_MSK_IAM: Kafka refused the IAM authentication"},
		{"no region", nil, 2, "needs --kafka-aws-region"},
		{"no TLS", map[string]string{"QUOTIENT_KAFKA_AWS_REGION": "eu-west-1", "QUOTIENT_KAFKA_TLS": "false", "QUOTIENT_KAFKA_TLS_CA": ""}, 2, "needs --kafka-tls"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vars := p.coordinatorVars(t, "a", "127.0.0.1:0", writePolicies(t, globalPolicy))
			vars["QUOTIENT_KAFKA_SASL"] = "AWS_MSK_IAM"
			delete(vars, "QUOTIENT_KAFKA_SASL_USER")
			delete(vars, "QUOTIENT_KAFKA_SASL_PASSWORD_FILE")
			maps.Copy(vars, tc.change)
			for k, v := range vars {
				if v == "" {
					delete(vars, k)
				}
			}
			env, errb := coordinatorEnvOf(vars)
			ctx, cancel := context.WithTimeout(t.Context(), startupCheckTimeout+20*time.Second)
			defer cancel()
			code := run(ctx, env, []string{"coordinator"})
			require.NoError(t, ctx.Err(), "the coordinator ran instead of failing: %s", errb.String())
			assert.Equal(t, tc.code, code, errb.String())
			lines := exitLine.FindAllString(errb.String(), -1)
			require.Len(t, lines, 1, "one line: %s", errb.String())
			assert.Contains(t, lines[0], tc.want)
			t.Log(lines[0])
		})
	}
}
