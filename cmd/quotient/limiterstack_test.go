package main

import (
	"flag"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/limiter"
)

// TestRedisPipelineDefault checks that --redis-pipeline defaults to the
// limiter's own pipeline default, so a gateway started without the flag
// pipelines as limiter.DefaultPipelineConfig documents and measures.
func TestRedisPipelineDefault(t *testing.T) {
	var f limiterFlags
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f.register(fs)
	require.NoError(t, fs.Parse(nil))
	assert.Equal(t, limiter.DefaultPipelineConfig().Workers, f.pipeline)
	assert.Equal(t, 2, f.pipeline, "the measured default (README, session expiry)")
	require.NoError(t, fs.Parse([]string{"--redis-pipeline", "4"}))
	assert.Equal(t, 4, f.pipeline)
}
