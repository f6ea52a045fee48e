// Package mskiam is the SASL mechanism of AWS MSK IAM access control for
// kafka-go: SASL/OAUTHBEARER (RFC 7628) whose bearer token is a SigV4-signed
// "kafka-cluster:Connect" request made by AWS's own signer,
// github.com/aws/aws-msk-iam-sasl-signer-go. MSK serves it on port 9098.
//
// It is a package of its own so that only the binaries that offer it link
// the AWS SDK (kafkautil does not).
//
// What it does not do: no goroutines, no caching (each new connection gets
// a fresh token, valid 15 minutes, which is all a SASL handshake needs),
// no network I/O of its own: the default credential chain may ask the ECS
// or EC2 metadata endpoint, as every AWS SDK client does.
package mskiam

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-msk-iam-sasl-signer-go/signer"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/segmentio/kafka-go/sasl"
)

// Mechanism authenticates to MSK with IAM. Region is required. The zero
// Credentials use the AWS SDK's default chain (environment, shared
// configuration, the ECS task role, the EC2 instance role). Safe for
// concurrent use.
type Mechanism struct {
	Region      string
	Credentials aws.CredentialsProvider
}

var _ sasl.Mechanism = Mechanism{}

// Name is the SASL mechanism MSK IAM uses.
func (Mechanism) Name() string { return "OAUTHBEARER" }

// Start signs a token and returns the OAUTHBEARER initial response. An
// error (no credentials, no region) fails the connection's handshake.
func (m Mechanism) Start(ctx context.Context) (sasl.StateMachine, []byte, error) {
	if m.Region == "" {
		return nil, nil, errors.New("mskiam: the AWS region is empty")
	}
	var token string
	var err error
	if m.Credentials != nil {
		token, _, err = signer.GenerateAuthTokenFromCredentialsProvider(ctx, m.Region, m.Credentials)
	} else {
		token, _, err = signer.GenerateAuthToken(ctx, m.Region)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("mskiam: sign the MSK IAM token for %s: %w", m.Region, err)
	}
	// RFC 7628 section 3.1: gs2 header "n,,", then kvsep-separated
	// key=value pairs, ending with two kvseps.
	return session{}, []byte("n,,\x01auth=Bearer " + token + "\x01\x01"), nil
}

type session struct{}

// Next ends the exchange: an empty challenge is success; a non-empty one
// is the broker's error (a JSON status), answered, as RFC 7628 says, with
// a single kvsep, and reported.
func (session) Next(_ context.Context, challenge []byte) (bool, []byte, error) {
	if len(challenge) == 0 {
		return true, nil, nil
	}
	return true, []byte("\x01"), fmt.Errorf("mskiam: the broker refused the IAM token: %s", challenge)
}
