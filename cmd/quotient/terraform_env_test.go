package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/deploy/terraform"
)

// regionModule is the Terraform module that runs `quotient coordinator`.
const regionModule = "../../deploy/terraform/modules/region"

// coordinatorEnv returns the environment variable of every flag of
// `quotient coordinator` and every secret variable it reads, and those of the flags a deployment must set:
// the ones documented as required, and redis and kafka, whose defaults are
// loopback addresses for local runs only.
func coordinatorEnv(t *testing.T) (known map[string]bool, required []string) {
	t.Helper()
	fs := coordinatorFlagSet(&coordinatorConfig{})
	known = map[string]bool{}
	// The secrets are environment variables and no flags (a flag value
	// shows in ps); the modules pass them as ECS secrets.
	for _, name := range secretEnv {
		known[name] = true
	}
	fs.VisitAll(func(f *flag.Flag) {
		known[envName(f.Name)] = true
		if strings.Contains(f.Usage, "(required)") || f.Name == "redis" || f.Name == "kafka" {
			required = append(required, envName(f.Name))
		}
	})
	for _, name := range []string{"region", "regions", "redis", "kafka"} {
		require.NotNil(t, fs.Lookup(name), "quotient coordinator has no --%s flag", name)
		require.Contains(t, required, envName(name))
	}
	return known, required
}

// TestTerraformCoordinatorSettingsAreFlags checks that every QUOTIENT_*
// setting deploy/terraform passes to the coordinator is a flag that
// `quotient coordinator` accepts, and that every required one is passed.
func TestTerraformCoordinatorSettingsAreFlags(t *testing.T) {
	known, required := coordinatorEnv(t)
	settings, err := terraform.CoordinatorEnv(regionModule)
	require.NoError(t, err)
	require.NotEmpty(t, settings, "found no QUOTIENT_* setting in %s", regionModule)

	problems, err := terraform.CheckCoordinatorEnv(regionModule, func(name string) bool { return known[name] }, required)
	require.NoError(t, err)
	assert.Empty(t, problems)

	// Every resource that requires TLS (or SCRAM) of its clients gets the
	// coordinator's setting for it, and the admin API gets listener TLS.
	problems, err = terraform.CheckTransportSecurity(regionModule, regionModule, "../../deploy/terraform/modules/kafka")
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// TestTerraformCoordinatorSettingsBroken breaks a copy of the module: a
// setting that is no flag, and a required flag left out.
func TestTerraformCoordinatorSettingsBroken(t *testing.T) {
	known, required := coordinatorEnv(t)
	dir := t.TempDir()
	require.NoError(t, os.CopyFS(dir, os.DirFS(regionModule)))
	main := filepath.Join(dir, "main.tf")
	src, err := os.ReadFile(main)
	require.NoError(t, err)
	require.Contains(t, string(src), "    QUOTIENT_REDIS ")
	src = []byte(strings.Replace(string(src), "    QUOTIENT_REDIS ", "    QUOTIENT_REDIS_ADDRS ", 1))
	require.NoError(t, os.WriteFile(main, src, 0o644))

	problems, err := terraform.CheckCoordinatorEnv(dir, func(name string) bool { return known[name] }, required)
	require.NoError(t, err)
	var msgs []string
	for _, p := range problems {
		msgs = append(msgs, p.String())
	}
	require.Len(t, msgs, 2, "%s", strings.Join(msgs, "\n"))
	assert.Contains(t, msgs[0], "main.tf:20: coordinator-env: QUOTIENT_REDIS_ADDRS is not a setting of quotient coordinator")
	assert.Contains(t, msgs[1], "required setting QUOTIENT_REDIS is not passed")
}
