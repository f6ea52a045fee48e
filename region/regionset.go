package region

import (
	"context"
	"time"

	"github.com/quotientlabs/quotient/limiter"
)

// regionSetRefresh is how often every replica writes the region set again
// (so a Redis restarted empty gets it back); a failed write is retried
// after regionSetRetry.
const (
	regionSetRefresh = 30 * time.Second
	regionSetRetry   = time.Second
)

// regionSet is what this coordinator states in its region's Redis for the
// gateways (limiter.RegionSetKey): the regions it computes shares for,
// its own name, the usage epoch and shard count it reads.
func (c *Coordinator) regionSet() limiter.RegionSet {
	shards := c.cfg.UsageShards
	if shards == 0 {
		shards = limiter.DefaultUsageShards
	}
	return limiter.RegionSet{Region: c.cfg.Region, Regions: c.cfg.Regions, Epoch: c.cfg.Epoch, UsageShards: shards, SplitShards: c.cfg.UsageSplitShards}
}

// publishRegionSet writes the region set at once and then every
// regionSetRefresh until ctx ends. Every replica writes the same record,
// so no leadership is needed.
func (c *Coordinator) publishRegionSet(ctx context.Context) {
	rs := c.regionSet()
	for {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := limiter.WriteRegionSet(wctx, c.redis, rs)
		cancel()
		wait := regionSetRefresh
		if err != nil && ctx.Err() == nil {
			c.log.Warn("region: write the region set for the gateways; retrying", "key", limiter.RegionSetKey, "err", err)
			wait = regionSetRetry
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}
