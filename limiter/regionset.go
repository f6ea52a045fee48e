package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// regionState is the region set a Limiter enforces global policies with.
type regionState struct {
	n    int64  // regions sharing every global policy (>= 1)
	name string // this region's name (replicated fixed-window counts)
}

// SetRegions changes, at once, the region set global policies are enforced
// with: a key without a share record then gets 1/regions of a global
// bucket's rate and burst, and replicated (global fixed-window) counts are
// kept under region. regions is 1..64 and region 1 to 64 of
// [A-Za-z0-9._-], as in Config. The fallback limiters and the deny cache
// are cleared, so no decision keeps the old default share. Safe for
// concurrent use with Check.
func (l *Limiter) SetRegions(region string, regions int) error {
	if regions < 1 || regions > 64 {
		return fmt.Errorf("limiter: SetRegions: regions must be between 1 and 64, got %d", regions)
	}
	if !idPattern.MatchString(region) {
		return fmt.Errorf("limiter: SetRegions: region %q must be 1 to 64 characters of A-Z a-z 0-9 . _ -", region)
	}
	old := l.rset.Load()
	if old.n == int64(regions) && old.name == region {
		return nil
	}
	l.rset.Store(&regionState{n: int64(regions), name: region})
	l.fb.setRegions(regions)
	if l.deny != nil {
		l.deny.clear()
	}
	return nil
}

// RegionSetting returns the region name and the number of regions global
// policies are enforced with (Config.Region and Config.Regions, or the
// last SetRegions).
func (l *Limiter) RegionSetting() (region string, regions int) {
	rs := l.rset.Load()
	return rs.name, int(rs.n)
}

// RegionSetKey is the Redis hash in which a region's coordinator states
// the region set it computes shares for (WriteRegionSet), so that the
// region's gateways enforce global policies with the same set
// (ReadRegionSet) instead of a number of their own.
const RegionSetKey = "qu:regionset"

// RegionSet is what a coordinator states about its region: the set of
// regions sharing global policies and the usage layout the gateways must
// write in. The zero value is invalid.
type RegionSet struct {
	// Region is this region's name, one of Regions.
	Region string
	// Regions are the names of every region sharing global policies, this
	// one included, 1..64, sorted and without duplicates (Normalize).
	Regions []string
	// Epoch is the usage epoch (the coordinators' --epoch).
	Epoch time.Duration
	// UsageShards is the number of usage hashes per epoch of the packed
	// layout, which the gateways write (NewRedisUsageSink); 0 in a record
	// of a coordinator of the previous release, which reads the split
	// layout: the gateways then write that (NewSplitUsageSink with
	// SplitShards), so gateways may be upgraded before their coordinator.
	UsageShards int
	// SplitShards is the split layout's shard count (record field
	// usage_shards, the one gateways of the previous release follow): the
	// coordinator still reads that layout with it, for a rolling upgrade;
	// 0 when it does not (the record then has no usage_shards, and a
	// gateway of the previous release keeps its flags).
	SplitShards int
}

// ErrRegionSet is wrapped by the errors of RegionSet.Validate and
// ParseRegionList.
var ErrRegionSet = errors.New("limiter: invalid region set")

// ParseRegionList parses a comma-separated list of region names (blanks
// around names ignored) into a sorted list without duplicates; an empty
// name, a name that is not 1 to 64 of [A-Za-z0-9._-], a repeated name or
// more than 64 names are errors.
func ParseRegionList(list string) ([]string, error) {
	var out []string
	for _, r := range strings.Split(list, ",") {
		r = strings.TrimSpace(r)
		if !idPattern.MatchString(r) {
			return nil, fmt.Errorf("%w: region name %q must be 1 to 64 characters of A-Z a-z 0-9 . _ -", ErrRegionSet, r)
		}
		if slices.Contains(out, r) {
			return nil, fmt.Errorf("%w: region %q listed twice", ErrRegionSet, r)
		}
		out = append(out, r)
	}
	if len(out) > 64 {
		return nil, fmt.Errorf("%w: %d regions, at most 64", ErrRegionSet, len(out))
	}
	slices.Sort(out)
	return out, nil
}

// Validate reports the first problem of rs, naming the field.
func (rs RegionSet) Validate() error {
	switch {
	case len(rs.Regions) < 1 || len(rs.Regions) > 64:
		return fmt.Errorf("%w: %d regions, want 1..64", ErrRegionSet, len(rs.Regions))
	case !slices.Contains(rs.Regions, rs.Region):
		return fmt.Errorf("%w: region %q is not one of regions %s", ErrRegionSet, rs.Region, strings.Join(rs.Regions, ","))
	case rs.Epoch < time.Millisecond:
		return fmt.Errorf("%w: epoch %v, want at least 1ms", ErrRegionSet, rs.Epoch)
	case rs.UsageShards < 0:
		return fmt.Errorf("%w: usage shards %d, want >= 0", ErrRegionSet, rs.UsageShards)
	case rs.SplitShards < 0:
		return fmt.Errorf("%w: split usage shards %d, want >= 0", ErrRegionSet, rs.SplitShards)
	case rs.UsageShards == 0 && rs.SplitShards == 0:
		return fmt.Errorf("%w: no usage layout: usage shards and split usage shards both 0", ErrRegionSet)
	}
	if _, err := ParseRegionList(strings.Join(rs.Regions, ",")); err != nil {
		return err
	}
	return nil
}

// Differences lists, as "field: ours vs theirs", where rs and o disagree;
// empty when they agree (the order of Regions does not count).
func (rs RegionSet) Differences(o RegionSet) []string {
	var d []string
	a, b := slices.Sorted(slices.Values(rs.Regions)), slices.Sorted(slices.Values(o.Regions))
	if !slices.Equal(a, b) {
		d = append(d, fmt.Sprintf("regions: %s vs %s", strings.Join(a, ","), strings.Join(b, ",")))
	}
	if rs.Region != o.Region {
		d = append(d, fmt.Sprintf("region: %s vs %s", rs.Region, o.Region))
	}
	if rs.Epoch != o.Epoch {
		d = append(d, fmt.Sprintf("epoch: %v vs %v", rs.Epoch, o.Epoch))
	}
	if rs.UsageShards != o.UsageShards {
		d = append(d, fmt.Sprintf("usage shards: %d vs %d", rs.UsageShards, o.UsageShards))
	}
	// The split layout's count matters to a gateway only when it writes
	// that layout (no packed shards).
	if (rs.UsageShards == 0 || o.UsageShards == 0) && rs.SplitShards != o.SplitShards {
		d = append(d, fmt.Sprintf("split usage shards: %d vs %d", rs.SplitShards, o.SplitShards))
	}
	return d
}

// WriteRegionSet stores rs under RegionSetKey in the region's Redis, with
// no expiry (a coordinator writes it at start and again periodically, so
// a Redis restarted empty gets it back). rs must be valid.
func WriteRegionSet(ctx context.Context, client redis.UniversalClient, rs RegionSet) error {
	if err := rs.Validate(); err != nil {
		return err
	}
	pipe := client.TxPipeline() // one key: one slot
	pipe.HSet(ctx, RegionSetKey,
		"region", rs.Region,
		"regions", strings.Join(rs.Regions, ","),
		"epoch_ms", rs.Epoch.Milliseconds(),
	)
	if rs.SplitShards > 0 {
		pipe.HSet(ctx, RegionSetKey, "usage_shards", rs.SplitShards)
	} else {
		pipe.HDel(ctx, RegionSetKey, "usage_shards")
	}
	if rs.UsageShards > 0 {
		pipe.HSet(ctx, RegionSetKey, "usage_packed_shards", rs.UsageShards)
	} else {
		pipe.HDel(ctx, RegionSetKey, "usage_packed_shards")
	}
	_, err := pipe.Exec(ctx)
	return err
}

// ReadRegionSet reads what WriteRegionSet stored. It returns false and no
// error when there is none; an error when Redis fails or the record is
// malformed (which names the field).
func ReadRegionSet(ctx context.Context, client redis.UniversalClient) (RegionSet, bool, error) {
	m, err := client.HGetAll(ctx, RegionSetKey).Result()
	if err != nil {
		return RegionSet{}, false, fmt.Errorf("limiter: read %s: %w", RegionSetKey, err)
	}
	if len(m) == 0 {
		return RegionSet{}, false, nil
	}
	var rs RegionSet
	rs.Region = m["region"]
	if rs.Regions, err = ParseRegionList(m["regions"]); err != nil {
		return RegionSet{}, false, fmt.Errorf("limiter: %s regions: %w", RegionSetKey, err)
	}
	ms, err := strconv.ParseInt(m["epoch_ms"], 10, 64)
	if err != nil {
		return RegionSet{}, false, fmt.Errorf("%w: %s epoch_ms %q", ErrRegionSet, RegionSetKey, m["epoch_ms"])
	}
	rs.Epoch = time.Duration(ms) * time.Millisecond
	for _, f := range []struct {
		name string
		to   *int
	}{{"usage_shards", &rs.SplitShards}, {"usage_packed_shards", &rs.UsageShards}} {
		v, ok := m[f.name]
		if !ok {
			continue // 0: the coordinator does not read (usage_shards) or write (usage_packed_shards) that layout
		}
		if *f.to, err = strconv.Atoi(v); err != nil {
			return RegionSet{}, false, fmt.Errorf("%w: %s %s %q", ErrRegionSet, RegionSetKey, f.name, v)
		}
	}
	if err := rs.Validate(); err != nil {
		return RegionSet{}, false, fmt.Errorf("limiter: %s: %w", RegionSetKey, err)
	}
	return rs, true, nil
}
