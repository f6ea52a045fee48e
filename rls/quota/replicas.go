package quota

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ReplicaClaim is one replica's record on one bucket, as the region's
// replicas publish it (ReplicaStore).
type ReplicaClaim struct {
	// Replica names the process; unique per process, so that a restarted
	// replica never overwrites what its predecessor claimed.
	Replica string
	// DemandMilli is the demand of the replica's Envoys (Core.Demand), in
	// milli requests per second.
	DemandMilli int64
	// Claim bounds what the replica's Envoys may hold (the rate of the
	// assignments in force and the bursts held, as Core.Reserved) at any
	// instant until Expires.
	Claim Amount
	// Expires is on the store's clock; after it the replica's Envoys hold
	// nothing of the bucket (its grants were all made to run out first).
	Expires time.Time
}

// ClaimRequest is what a replica asks of the store for one bucket.
type ClaimRequest struct {
	// Share is the region's share of the bucket, as the replica reads it.
	Share Amount
	// DemandMilli is the replica's demand (Core.Demand).
	DemandMilli int64
	// Ceiling bounds what the replica's Envoys may hold from now on under
	// the part it has (Core.Ceiling, taken before the call).
	Ceiling Amount
	// Lease is how long the record lasts, from the store's clock at the
	// call.
	Lease time.Duration
	// Part is the part the replica's Core splits now (zero before the
	// first call), kept while the new one would be close to it
	// (ThresholdPermille below, a quarter of it above).
	Part Amount
	// ThresholdPermille is the Core's (Config.ThresholdPermille).
	ThresholdPermille int64
}

// ReplicaStore is where the RLQS replicas of a region publish their
// demand and claims on each bucket's share (the region's Redis:
// RedisClaims). Claim must, atomically with respect to the other
// replicas' calls on the same bucket: drop the records that expired on
// the store's clock, compute Allocate from the others' live records and
// write the replica's own record (the returned claim, the demand, an
// expiry Lease after the store's clock at the call). It returns the part
// the replica may split among its Envoys. An error means the record may
// or may not have been written; the caller keeps the part it had (which
// the record it had, or the new one, covers) and does not extend its
// lease. It must honour ctx.
type ReplicaStore interface {
	Claim(ctx context.Context, k BucketKey, req ClaimRequest) (Amount, error)
}

// Allocate is the replicas' split of a bucket's share, pure: the
// replica's part (what its Core may split) and the claim it records.
//
// The part is the replica's max-min fair target over the live replicas'
// demand (split, the replica's own demand included), cut to what the
// others' claims leave of the share. The claim is the larger of the part
// and the ceiling (what its Envoys may still hold under its previous
// part, which it cannot take back), or the part alone when the replica
// has no live record (own is nil): then its previous lease ran out, so
// its Envoys hold nothing and its Core grants nothing before the new part
// arrives.
//
// Why the claims stay within the share: the others' claims plus the new
// part fit by construction; the ceiling is at most the replica's live
// record (its Envoys stayed within it), which fitted with the others'
// claims when it was written, and the others only lower or write
// claims that fit beside it. A replica lowering its part therefore gives
// room to the others only at its next call after its Envoys' larger
// assignments ran out (TTL + InFlight). While the replicas read
// different shares (one ShareRefresh after a change), the sum is bounded
// by the largest share read; a lowered share is reached as the
// ceilings fall, TTL + InFlight later.
func Allocate(share Amount, me string, demandMilli int64, ceiling Amount, own *ReplicaClaim, others []ReplicaClaim) (part, claim Amount) {
	return allocate(share, ClaimRequest{DemandMilli: demandMilli, Ceiling: ceiling}, own, others)
}

// allocate is Allocate with the damping of ClaimRequest.Part: a replica
// keeps the part it has, when that still fits beside the others' claims,
// while nobody needs a change (its demand is within its part and the
// others' demand, ThresholdPermille over, within what its part leaves of
// the share), or when the new part's rate would be below it by no more
// than ThresholdPermille of it, or above by no more than a quarter of
// that (as the Core damps an Envoy's assignment). Every change of part moves its Envoys' targets, and a changed
// assignment is a new, full Envoy bucket: without it, the Poisson noise
// of the replicas' demand re-split the share every second (rlqs-abrupt-
// shift with 2 replicas admitted 6.6 % over the limit).
func allocate(share Amount, req ClaimRequest, own *ReplicaClaim, others []ReplicaClaim) (part, claim Amount) {
	demandMilli, ceiling := req.DemandMilli, req.Ceiling
	share.RateMilli, share.BurstMilli = max(0, share.RateMilli), max(0, share.BurstMilli)
	others = slices.Clone(others)
	slices.SortFunc(others, func(a, b ReplicaClaim) int { return strings.Compare(a.Replica, b.Replica) })
	demands := []int64{max(0, demandMilli)}
	var held Amount
	for _, o := range others {
		demands = append(demands, max(0, o.DemandMilli))
		held = held.add(Amount{max(0, o.Claim.RateMilli), max(0, o.Claim.BurstMilli)})
	}
	target := split(share, demands)[0]
	room := Amount{max(0, share.RateMilli-held.RateMilli), max(0, share.BurstMilli-held.BurstMilli)}
	part = Amount{min(target.RateMilli, room.RateMilli), min(target.BurstMilli, room.BurstMilli)}
	if cur := req.Part; own != nil && cur != (Amount{}) && cur.fits(room) {
		var othersDemand int64
		for _, o := range others {
			othersDemand = satAdd(othersDemand, max(0, o.DemandMilli))
		}
		up, down := part.RateMilli-cur.RateMilli, cur.RateMilli-part.RateMilli
		// Nobody needs a change while the replica's demand is within its
		// part and the others' demand, ThresholdPermille over, within
		// what it leaves of the share.
		needMore := demandMilli > cur.RateMilli
		othersNeed := othersDemand > mulDiv(max(0, share.RateMilli-cur.RateMilli), 1000, 1000+req.ThresholdPermille)
		if !needMore && !othersNeed ||
			up >= 0 && up <= mulDiv(cur.RateMilli, req.ThresholdPermille, 4000) ||
			down > 0 && down <= mulDiv(cur.RateMilli, req.ThresholdPermille, 1000) {
			part = cur
		}
	}
	if own == nil {
		return part, part
	}
	return part, maxAmount(part, ceiling)
}

// RedisClaims is a ReplicaStore on the region's Redis (standalone or
// cluster): one hash per bucket, ClaimKeyPrefix + the bucket's key, a
// field per replica holding "demand rate burst expires" (milli units,
// expiry in Unix milliseconds on the Redis server's clock). Each Claim is
// one optimistic transaction (WATCH the hash, HGETALL and TIME, then
// MULTI: HDEL the expired fields, HSET the replica's, PEXPIRE the hash
// past the latest expiry), retried up to ClaimRetries times when another
// replica wrote the hash meanwhile. Safe for concurrent use.
type RedisClaims struct {
	Client redis.UniversalClient
	// Replica names this process (NewReplicaID); required.
	Replica string
	// Clock, when set, is the store's clock instead of the Redis
	// server's TIME (tests that move every replica's clock at once); all
	// the replicas of a region must then share it.
	Clock Clock
}

// ClaimKeyPrefix starts the key of every bucket's claims hash.
const ClaimKeyPrefix = "quotient:rlqs:claims:"

// ClaimRetries bounds the attempts of one RedisClaims.Claim.
const ClaimRetries = 8

// ErrClaimContended is returned when every attempt of a Claim found the
// hash written by another replica.
var ErrClaimContended = errors.New("quota: replica claims: the bucket's record kept changing; retried")

// NewReplicaID returns a random replica name (hostname-independent, 16
// hex digits) for RedisClaims.Replica: a restarted process gets a new
// one.
func NewReplicaID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

var _ ReplicaStore = (*RedisClaims)(nil)

func encodeClaim(c ReplicaClaim) string {
	return fmt.Sprintf("%d %d %d %d", c.DemandMilli, c.Claim.RateMilli, c.Claim.BurstMilli, c.Expires.UnixMilli())
}

func decodeClaim(replica, v string) (ReplicaClaim, error) {
	f := strings.Fields(v)
	if len(f) != 4 {
		return ReplicaClaim{}, fmt.Errorf("quota: replica claim %q of %s: want 4 numbers", v, replica)
	}
	var n [4]int64
	for i, s := range f {
		x, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return ReplicaClaim{}, fmt.Errorf("quota: replica claim %q of %s: %w", v, replica, err)
		}
		n[i] = x
	}
	return ReplicaClaim{Replica: replica, DemandMilli: n[0], Claim: Amount{n[1], n[2]}, Expires: time.UnixMilli(n[3])}, nil
}

// Claim implements ReplicaStore. A field that does not decode is counted
// as claiming the whole share until the hash expires (fail-safe), and
// named in the error with the part computed anyway.
func (r *RedisClaims) Claim(ctx context.Context, k BucketKey, req ClaimRequest) (Amount, error) {
	if r.Replica == "" {
		return Amount{}, errors.New("quota: RedisClaims.Replica is empty")
	}
	key := ClaimKeyPrefix + string(k)
	var part Amount
	var bad error
	txf := func(tx *redis.Tx) error {
		fields, err := tx.HGetAll(ctx, key).Result()
		if err != nil {
			return err
		}
		var now time.Time
		if r.Clock != nil {
			now = r.Clock.Now()
		} else if now, err = tx.Time(ctx).Result(); err != nil {
			return err
		}
		var own *ReplicaClaim
		var others []ReplicaClaim
		var expired []string
		latest := now
		bad = nil
		for name, v := range fields {
			c, err := decodeClaim(name, v)
			if err != nil {
				bad = err
				others = append(others, ReplicaClaim{Replica: name, Claim: req.Share})
				continue
			}
			switch {
			case !now.Before(c.Expires):
				expired = append(expired, name)
			case name == r.Replica:
				own = &c
			default:
				others = append(others, c)
				if c.Expires.After(latest) {
					latest = c.Expires
				}
			}
		}
		var claim Amount
		part, claim = allocate(req.Share, req, own, others)
		exp := now.Add(req.Lease)
		if exp.After(latest) {
			latest = exp
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			if len(expired) > 0 {
				p.HDel(ctx, key, expired...)
			}
			p.HSet(ctx, key, r.Replica, encodeClaim(ReplicaClaim{DemandMilli: req.DemandMilli, Claim: claim, Expires: exp}))
			p.PExpireAt(ctx, key, latest.Add(time.Second))
			return nil
		})
		return err
	}
	for range ClaimRetries {
		err := r.Client.Watch(ctx, txf, key)
		if errors.Is(err, redis.TxFailedErr) {
			continue
		}
		if err != nil {
			return Amount{}, fmt.Errorf("quota: replica claims of %s: %w", key, err)
		}
		return part, bad
	}
	return Amount{}, ErrClaimContended
}

// ClaimTable is a ReplicaStore in memory for one process that plays all
// the replicas of a region (the simulator, tests): Replica returns each
// replica's view. Its clock is the store's. Safe for concurrent use.
type ClaimTable struct {
	Clock Clock

	mu   sync.Mutex
	recs map[BucketKey]map[string]ReplicaClaim
}

// Replica returns the ReplicaStore of the replica named name.
func (t *ClaimTable) Replica(name string) ReplicaStore { return tableReplica{t, name} }

// Claims returns the live records of bucket k, sorted by replica (the
// caller owns the slice).
func (t *ClaimTable) Claims(k BucketKey) []ReplicaClaim {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.Clock.Now()
	var out []ReplicaClaim
	for _, c := range t.recs[k] {
		if now.Before(c.Expires) {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b ReplicaClaim) int { return strings.Compare(a.Replica, b.Replica) })
	return out
}

type tableReplica struct {
	t    *ClaimTable
	name string
}

func (r tableReplica) Claim(_ context.Context, k BucketKey, req ClaimRequest) (Amount, error) {
	t := r.t
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.Clock.Now()
	if t.recs == nil {
		t.recs = map[BucketKey]map[string]ReplicaClaim{}
	}
	m := t.recs[k]
	if m == nil {
		m = map[string]ReplicaClaim{}
		t.recs[k] = m
	}
	var own *ReplicaClaim
	var others []ReplicaClaim
	for name, c := range m {
		switch {
		case !now.Before(c.Expires):
			delete(m, name)
		case name == r.name:
			own = &c
		default:
			others = append(others, c)
		}
	}
	part, claim := allocate(req.Share, req, own, others)
	m[r.name] = ReplicaClaim{Replica: r.name, DemandMilli: req.DemandMilli, Claim: claim, Expires: now.Add(req.Lease)}
	return part, nil
}
