package mskiam_test

import (
	"context"
	"encoding/base64"
	"net/url"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/kafkautil/mskiam"
)

// TestStartSignsAnMSKToken: the initial response is an RFC 7628
// OAUTHBEARER message whose bearer token is a SigV4 presigned
// kafka-cluster:Connect request for the region, signed with the given
// credentials. (No broker here speaks OAUTHBEARER: kfake does not, so the
// exchange with MSK itself is not tested.)
func TestStartSignsAnMSKToken(t *testing.T) {
	m := mskiam.Mechanism{Region: "eu-west-1", Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", "")}
	assert.Equal(t, "OAUTHBEARER", m.Name())
	sess, ir, err := m.Start(context.Background())
	require.NoError(t, err)
	msg := string(ir)
	require.True(t, strings.HasPrefix(msg, "n,,\x01auth=Bearer "), "%q", msg)
	require.True(t, strings.HasSuffix(msg, "\x01\x01"), "%q", msg)
	token := strings.TrimSuffix(strings.TrimPrefix(msg, "n,,\x01auth=Bearer "), "\x01\x01")
	raw, err := base64.RawURLEncoding.DecodeString(token)
	require.NoError(t, err)
	u, err := url.Parse(string(raw))
	require.NoError(t, err)
	assert.Equal(t, "kafka.eu-west-1.amazonaws.com", u.Host)
	q := u.Query()
	assert.Equal(t, "kafka-cluster:Connect", q.Get("Action"))
	assert.True(t, strings.HasPrefix(q.Get("X-Amz-Credential"), "AKIDEXAMPLE/"), q.Get("X-Amz-Credential"))
	assert.Contains(t, q.Get("X-Amz-Credential"), "/eu-west-1/kafka-cluster/aws4_request")
	assert.NotEmpty(t, q.Get("X-Amz-Signature"))
	assert.Equal(t, "900", q.Get("X-Amz-Expires"))
	assert.NotContains(t, string(raw), "secret")

	done, resp, err := sess.Next(context.Background(), nil)
	assert.True(t, done)
	assert.Nil(t, resp)
	assert.NoError(t, err)
	done, resp, err = sess.Next(context.Background(), []byte(`{"status":"invalid_token"}`))
	assert.True(t, done)
	assert.Equal(t, []byte("\x01"), resp)
	assert.ErrorContains(t, err, "invalid_token")
}

func TestStartNeedsRegionAndCredentials(t *testing.T) {
	_, _, err := mskiam.Mechanism{}.Start(context.Background())
	assert.ErrorContains(t, err, "region is empty")
	_, _, err = mskiam.Mechanism{Region: "eu-west-1", Credentials: credentials.NewStaticCredentialsProvider("", "", "")}.Start(context.Background())
	assert.ErrorContains(t, err, "credentials")
}
