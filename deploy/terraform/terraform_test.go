package terraform_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/deploy/terraform"
)

// The real tree: this directory holds modules/ and examples/.
const root = "."

func TestTreeIsClean(t *testing.T) {
	dirs, err := terraform.Dirs(root)
	require.NoError(t, err)
	assert.Equal(t, []string{"examples/three-regions", "modules/kafka", "modules/region"}, dirs)

	problems, err := terraform.CheckTree(root)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

func TestNotAModule(t *testing.T) {
	dir := t.TempDir()
	for name, check := range map[string]func(string) ([]terraform.Problem, error){
		"variables": terraform.CheckVariables,
		"format":    terraform.CheckFormat,
		"wiring":    terraform.CheckWiring,
		"readme":    terraform.CheckReadme,
	} {
		_, err := check(dir)
		assert.ErrorIs(t, err, terraform.ErrNotModule, name)
	}
	_, err := terraform.CheckTree(dir)
	assert.ErrorIs(t, err, terraform.ErrNotModule)
}

// copyTree copies the real modules and examples into a fresh directory and
// returns it, so a test can break the copy.
func copyTree(t *testing.T) string {
	t.Helper()
	dst := t.TempDir()
	for _, sub := range []string{"modules", "examples"} {
		require.NoError(t, os.CopyFS(filepath.Join(dst, sub), os.DirFS(filepath.Join(root, sub))))
	}
	cfg, err := os.ReadFile(filepath.Join(root, ".tflint.hcl"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dst, ".tflint.hcl"), cfg, 0o644))
	return dst
}

// edit applies a string replacement to a file of the copy, and fails the
// test if the text to replace is not there (the breakage would be a no-op).
func edit(t *testing.T, file, old, new string, n int) {
	t.Helper()
	src, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Contains(t, string(src), old, "%s no longer contains the text the test breaks", file)
	require.NoError(t, os.WriteFile(file, []byte(strings.Replace(string(src), old, new, n)), 0o644))
}

func appendTo(t *testing.T, file, text string) {
	t.Helper()
	f, err := os.OpenFile(file, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString(text)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

func messages(ps []terraform.Problem) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// assertReported asserts that some problem of check mentions every want
// fragment, in file (relative to the copy) when file is not empty.
func assertReported(t *testing.T, ps []terraform.Problem, check, file string, want ...string) {
	t.Helper()
	for _, p := range ps {
		if p.Check != check || (file != "" && !strings.HasSuffix(p.File, file)) {
			continue
		}
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(p.Message, w)
		}
		if ok {
			return
		}
	}
	t.Errorf("no %s problem in %s mentioning %q; got:\n%s", check, file, want, strings.Join(messages(ps), "\n"))
}

func TestBrokenTreeIsReported(t *testing.T) {
	tests := []struct {
		name    string
		breakIt func(t *testing.T, dir string)
		check   func(t *testing.T, ps []terraform.Problem)
	}{
		{
			name: "variable without type or description",
			breakIt: func(t *testing.T, dir string) {
				appendTo(t, filepath.Join(dir, "modules/region/variables.tf"), "\nvariable \"shard_hint\" {\n  default = 1\n}\n")
			},
			check: func(t *testing.T, ps []terraform.Problem) {
				assertReported(t, ps, terraform.CheckNameVariables, "modules/region/variables.tf", `"shard_hint"`, "no type")
				assertReported(t, ps, terraform.CheckNameVariables, "modules/region/variables.tf", `"shard_hint"`, "no description")
				assertReported(t, ps, terraform.CheckNameReadme, "modules/region/README.md", `input "shard_hint"`)
			},
		},
		{
			name: "output without description",
			breakIt: func(t *testing.T, dir string) {
				edit(t, filepath.Join(dir, "modules/kafka/outputs.tf"), "  description = \"ARN of the MSK cluster.\"\n", "", 1)
			},
			check: func(t *testing.T, ps []terraform.Problem) {
				assertReported(t, ps, terraform.CheckNameVariables, "modules/kafka/outputs.tf", `output "cluster_arn"`, "no description")
			},
		},
		{
			name: "unformatted file",
			breakIt: func(t *testing.T, dir string) {
				edit(t, filepath.Join(dir, "modules/kafka/outputs.tf"), "  value       = aws_msk_cluster.this.arn", "  value = aws_msk_cluster.this.arn", 1)
			},
			check: func(t *testing.T, ps []terraform.Problem) {
				assertReported(t, ps, terraform.CheckNameFormat, "modules/kafka/outputs.tf", "canonical format")
			},
		},
		{
			name: "example does not wire a required input",
			breakIt: func(t *testing.T, dir string) {
				edit(t, filepath.Join(dir, "examples/three-regions/main.tf"), "  kafka_bootstrap_brokers = module.kafka_eu_west_1.bootstrap_brokers_tls_list\n", "", 1)
			},
			check: func(t *testing.T, ps []terraform.Problem) {
				assertReported(t, ps, terraform.CheckNameWiring, "examples/three-regions/main.tf", `module "region_eu_west_1"`, `required input "kafka_bootstrap_brokers"`)
			},
		},
		{
			name: "example passes an input the module does not declare",
			breakIt: func(t *testing.T, dir string) {
				edit(t, filepath.Join(dir, "examples/three-regions/main.tf"), "  regions     = local.regions\n", "  regions     = local.regions\n  zones       = 3\n", 1)
			},
			check: func(t *testing.T, ps []terraform.Problem) {
				assertReported(t, ps, terraform.CheckNameWiring, "examples/three-regions/main.tf", `module "region_us_east_1" passes "zones"`)
			},
		},
		{
			name: "README misses an output",
			breakIt: func(t *testing.T, dir string) {
				edit(t, filepath.Join(dir, "modules/region/README.md"), "`coordinator_log_group_name`", "coordinator log group", -1)
			},
			check: func(t *testing.T, ps []terraform.Problem) {
				assertReported(t, ps, terraform.CheckNameReadme, "modules/region/README.md", `output "coordinator_log_group_name"`)
			},
		},
		{
			name: "file does not parse",
			breakIt: func(t *testing.T, dir string) {
				appendTo(t, filepath.Join(dir, "modules/kafka/main.tf"), "\nresource \"aws_s3_bucket\" \"x\" {\n")
			},
			check: func(t *testing.T, ps []terraform.Problem) {
				assertReported(t, ps, terraform.CheckNameSyntax, "modules/kafka/main.tf")
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := copyTree(t)
			clean, err := terraform.CheckTree(dir)
			require.NoError(t, err)
			require.Empty(t, clean, "the copy must be clean before it is broken")

			tt.breakIt(t, dir)
			problems, err := terraform.CheckTree(dir)
			require.NoError(t, err)
			tt.check(t, problems)
		})
	}
}

func TestCoordinatorEnvBroken(t *testing.T) {
	// The real flag set is checked in cmd/quotient/terraform_env_test.go;
	// here the known settings are the ones the real module passes, to show
	// the check reports an added unknown one and a dropped required one.
	pristine, err := terraform.CoordinatorEnv(filepath.Join(root, "modules/region"))
	require.NoError(t, err)
	known := map[string]bool{}
	for _, s := range pristine {
		known[s.Name] = true
	}
	require.Contains(t, known, "QUOTIENT_KAFKA")
	isKnown := func(name string) bool { return known[name] }
	required := []string{"QUOTIENT_REGION", "QUOTIENT_REGIONS", "QUOTIENT_REDIS", "QUOTIENT_KAFKA"}

	dir := filepath.Join(copyTree(t), "modules/region")
	ps, err := terraform.CheckCoordinatorEnv(dir, isKnown, required)
	require.NoError(t, err)
	require.Empty(t, ps)

	edit(t, filepath.Join(dir, "main.tf"), "    QUOTIENT_KAFKA ", "    QUOTIENT_KAFKA_BROKERS ", 1)
	ps, err = terraform.CheckCoordinatorEnv(dir, isKnown, required)
	require.NoError(t, err)
	assertReported(t, ps, terraform.CheckNameCoordinator, "modules/region/main.tf", "QUOTIENT_KAFKA_BROKERS is not a setting")
	assertReported(t, ps, terraform.CheckNameCoordinator, "", "required setting QUOTIENT_KAFKA is not passed")
	assert.Len(t, ps, 2)
}

// tool finds an installed binary on PATH or in $(go env GOPATH)/bin, or
// skips the test: scripts/terraform-check.sh installs both tools, so CI has
// them.
func tool(t *testing.T, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "bin", name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skipf("%s is not installed; run scripts/terraform-check.sh (it installs the pinned version)", name)
	return ""
}

func TestHclfmtRejectsUnformattedFile(t *testing.T) {
	hclfmt := tool(t, "hclfmt")
	dir := copyTree(t)
	file := filepath.Join(dir, "modules/kafka/outputs.tf")
	run := func() error {
		return exec.Command(hclfmt, "-check", "-require-no-change", file).Run()
	}
	require.NoError(t, run(), "hclfmt must accept the real file")
	edit(t, file, "  value       = aws_msk_cluster.this.arn", "  value = aws_msk_cluster.this.arn", 1)
	assert.Error(t, run(), "hclfmt must reject the unformatted file")
}

func TestTflintRejectsUntypedVariable(t *testing.T) {
	tflint := tool(t, "tflint")
	dir := copyTree(t)
	run := func() (string, error) {
		cmd := exec.Command(tflint, "--recursive", "--config", filepath.Join(dir, ".tflint.hcl"), "--minimum-failure-severity=notice", "--no-color")
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run()
	require.NoError(t, err, "tflint must accept the real tree:\n%s", out)

	appendTo(t, filepath.Join(dir, "modules/region/variables.tf"), "\nvariable \"shard_hint\" {\n  default = 1\n}\n")
	out, err = run()
	require.Error(t, err, "tflint must reject the broken tree")
	assert.Contains(t, out, "terraform_typed_variables")
	assert.Contains(t, out, "terraform_documented_variables")
	assert.Contains(t, out, "terraform_unused_declarations")
}

// TestTransportSecurity: the region module passes the coordinator the TLS
// settings that the resources of the tree require (ElastiCache in-transit
// encryption, MSK's TLS listener, SCRAM) and listener TLS for the admin API.
func TestTransportSecurity(t *testing.T) {
	reqs, err := terraform.TransportRequirements("modules/region", "modules/kafka")
	require.NoError(t, err)
	var settings []string
	for _, r := range reqs {
		settings = append(settings, r.Resource+" "+r.Setting)
	}
	assert.ElementsMatch(t, []string{
		"aws_elasticache_replication_group.this QUOTIENT_REDIS_TLS",
		"aws_msk_cluster.this QUOTIENT_KAFKA_TLS",
		"aws_msk_cluster.this QUOTIENT_KAFKA_SASL", // scram is computed from sasl_scram_secret_arns: it may be on
	}, settings)
	problems, err := terraform.CheckTransportSecurity("modules/region", "modules/region", "modules/kafka")
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// TestTransportSecurityForgotten breaks copies of the tree: a module that
// requires TLS on a resource and does not pass the binary's setting for it
// fails the check, naming the resource and the setting.
func TestTransportSecurityForgotten(t *testing.T) {
	for _, tc := range []struct {
		name, file, old, new, want string
	}{
		{"redis", "modules/region/main.tf", `    QUOTIENT_REDIS_TLS       = "true"` + "\n", "",
			"aws_elasticache_replication_group.this requires secured clients (transit_encryption_enabled = true) but"},
		{"kafka", "modules/region/main.tf", `    QUOTIENT_KAFKA_TLS       = "true"` + "\n", "",
			`aws_msk_cluster.this requires secured clients (client_broker = "TLS")`},
		{"scram", "modules/region/main.tf", `{ QUOTIENT_KAFKA_SASL = "SCRAM-SHA-512" }`, `{}`,
			"aws_msk_cluster.this requires secured clients (client_authentication.sasl.scram)"},
		{"listener", "modules/region/main.tf", `    QUOTIENT_LISTEN_TLS_CERT = local.listen_tls_cert_file` + "\n", "",
			"QUOTIENT_LISTEN_TLS_CERT is not passed: the coordinator refuses bearer tokens in the clear"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyTree(t)
			edit(t, filepath.Join(dir, tc.file), tc.old, tc.new, 1)
			region, kafka := filepath.Join(dir, "modules/region"), filepath.Join(dir, "modules/kafka")
			problems, err := terraform.CheckTransportSecurity(region, region, kafka)
			require.NoError(t, err)
			require.Len(t, problems, 1, "%v", problems)
			assert.Contains(t, problems[0].String(), tc.want)
			assert.Equal(t, terraform.CheckNameTransport, problems[0].Check)
		})
	}

	// MSK's default is TLS: a cluster without the encryption block still
	// requires it; plaintext does not.
	dir := copyTree(t)
	kafkaMain := filepath.Join(dir, "modules/kafka/main.tf")
	edit(t, kafkaMain, `client_broker = "TLS"`, `client_broker = "PLAINTEXT"`, 1)
	reqs, err := terraform.TransportRequirements(filepath.Join(dir, "modules/kafka"))
	require.NoError(t, err)
	for _, r := range reqs {
		assert.NotEqual(t, "QUOTIENT_KAFKA_TLS", r.Setting)
	}
}
