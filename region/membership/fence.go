package membership

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Fence orders the epochs a region publishes, across its replicas: Claim
// succeeds for an epoch only if it is above every epoch claimed before, once.
// It lives in the region's Redis (one key per region). Safe for concurrent
// use.
type Fence struct {
	client redis.UniversalClient
	key    string
}

// NewFence returns the fence of region in client.
func NewFence(client redis.UniversalClient, region string) *Fence {
	return &Fence{client: client, key: "quotient:epoch-fence:{" + region + "}"}
}

var claimScript = redis.NewScript(`
local last = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '-1')
if tonumber(ARGV[1]) <= last then return 0 end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'owner', ARGV[2])
return 1
`)

// Claim claims epoch for owner: true if owner may publish it (no one did
// or will); false if an epoch at or above it was already claimed. An error
// means nothing is known: the caller must not publish.
func (f *Fence) Claim(ctx context.Context, epoch int64, owner string) (bool, error) {
	n, err := claimScript.Run(ctx, f.client, []string{f.key}, epoch, owner).Int()
	if err != nil {
		return false, fmt.Errorf("membership: claim epoch %d: %w", epoch, err)
	}
	return n == 1, nil
}

// Last is the last epoch claimed, and false when none was.
func (f *Fence) Last(ctx context.Context) (int64, bool, error) {
	n, err := f.client.HGet(ctx, f.key, "epoch").Int64()
	if errors.Is(err, redis.Nil) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("membership: last epoch: %w", err)
	}
	return n, true, nil
}

// NewPartFence returns the fence of key part part of parts in region:
// each part of a coordinator that splits the key space is its own
// protocol instance, with its own epochs claimed. With parts <= 1 it is
// NewFence (the key a coordinator without parts uses).
func NewPartFence(client redis.UniversalClient, region string, part, parts int) *Fence {
	if parts <= 1 {
		return NewFence(client, region)
	}
	return &Fence{client: client, key: "quotient:epoch-fence:{" + region + "}:part:" + strconv.Itoa(part) + "/" + strconv.Itoa(parts)}
}
