package admin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/quotientlabs/quotient/limiter"
)

// Kind is what a Record holds.
type Kind string

// Record kinds, as on the wire (PolicyRecord.kind).
const (
	KindPolicy   Kind = "policy"
	KindOverride Kind = "override"
)

// Record is one version of a policy or an override: the unit of the durable
// log (proto quotient.v1.PolicyRecord) and of the Catalog. A Record is a
// value; the Catalog never modifies the Document it was given.
type Record struct {
	// Kind is KindPolicy or KindOverride.
	Kind Kind
	// ID is the policy id, or the override id (see OverrideID).
	ID string
	// Version is >= 1, one above the previous version of (Kind, ID).
	Version int64
	// Document is the JSON document of this version: a limiter policy
	// document (with this ID and Version) or an Override. Empty when
	// Deleted.
	Document []byte
	// Deleted marks a tombstone: (Kind, ID) does not exist as of Version.
	Deleted bool
	// Author is the principal that wrote the version.
	Author string
	// UnixMs is when the version was written, Unix milliseconds.
	UnixMs int64
}

// Key is the record's key on the compacted topic: kind/id/version. Every
// version has its own key, so compaction keeps the whole history (as a
// schema registry keeps every schema version) and only removes exact
// re-sends.
func (r Record) Key() string {
	return string(r.Kind) + "/" + r.ID + "/" + strconv.FormatInt(r.Version, 10)
}

// Time is UnixMs as a time.Time.
func (r Record) Time() time.Time { return time.UnixMilli(r.UnixMs).UTC() }

// after reports whether r sorts after o among two records of the same
// (kind, id, version): the later write wins, ties broken by author then
// document bytes, so every region keeps the same one.
func (r Record) after(o Record) bool {
	if r.UnixMs != o.UnixMs {
		return r.UnixMs > o.UnixMs
	}
	if r.Author != o.Author {
		return r.Author > o.Author
	}
	if r.Deleted != o.Deleted {
		return r.Deleted
	}
	return bytes.Compare(r.Document, o.Document) > 0
}

func (r Record) same(o Record) bool {
	return r.Kind == o.Kind && r.ID == o.ID && r.Version == o.Version && r.Deleted == o.Deleted &&
		r.Author == o.Author && r.UnixMs == o.UnixMs && bytes.Equal(r.Document, o.Document)
}

// ErrBadRecord is wrapped by Catalog.Apply for a record it cannot hold.
var ErrBadRecord = errors.New("admin: bad record")

// Override replaces the limits of one policy for one subject until it
// expires. Its ID is derived from (Policy, Subject) by OverrideID, so a
// subject has at most one override per policy and posting again replaces it.
type Override struct {
	// ID is OverrideID(Policy, Subject); set by the server.
	ID string `json:"id"`
	// Subject is the subject in its store-key form (limiter.Subject.Key):
	// "k:<api key>", "a:<account>", "u:<user>" or "ip:<address or /64>".
	Subject string `json:"subject"`
	// Policy is the id of the policy overridden.
	Policy string `json:"policy"`
	// RatePerSec and Burst replace the policy's (buckets only); zero keeps
	// the policy's value.
	RatePerSec float64 `json:"rate_per_sec,omitempty"`
	Burst      float64 `json:"burst,omitempty"`
	// Limit replaces the policy's limit (windows only); zero keeps it.
	Limit int64 `json:"limit,omitempty"`
	// ExpiresAt is when the override stops applying (exclusive).
	ExpiresAt time.Time `json:"expires_at"`
	// Reason is free text for the audit log.
	Reason string `json:"reason,omitempty"`
}

// Active reports whether the override applies at now.
func (o *Override) Active(now time.Time) bool { return now.Before(o.ExpiresAt) }

// Apply returns p with the override's limits. p must be validated; the
// result is validated, has p's ID (so it counts in the same buckets) and
// fails when the override's parameters do not fit p's algorithm.
func (o *Override) Apply(p *limiter.Policy) (*limiter.Policy, error) {
	raw, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("admin: override: %w", err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("admin: override: %w", err)
	}
	set := func(k string, v any) {
		b, _ := json.Marshal(v)
		m[k] = b
	}
	if o.RatePerSec != 0 {
		set("rate_per_sec", o.RatePerSec)
	}
	if o.Burst != 0 {
		set("burst", o.Burst)
	} else if o.RatePerSec != 0 && p.Burst < o.RatePerSec {
		// The policy's burst defaulted from its rate; keep that rule.
		delete(m, "burst")
	}
	if o.Limit != 0 {
		set("limit", o.Limit)
	}
	raw, _ = json.Marshal(m)
	q, err := limiter.ParsePolicy(raw)
	if err != nil {
		return nil, err
	}
	return q, nil
}

var subjectPattern = regexp.MustCompile(`^(k|a|u|ip):.{1,512}$`)

// OverrideID is the id of the override of policy for subject: 32 hex
// digits of SHA-256(policy NUL subject).
func OverrideID(policy, subject string) string {
	h := sha256.Sum256([]byte(policy + "\x00" + subject))
	return hex.EncodeToString(h[:16])
}

// parseOverride decodes and checks an override document as stored.
func parseOverride(doc []byte) (*Override, error) {
	var o Override
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		return nil, err
	}
	if o.ID != OverrideID(o.Policy, o.Subject) {
		return nil, fmt.Errorf("id %q is not the id of policy %q and subject %q", o.ID, o.Policy, o.Subject)
	}
	if o.ExpiresAt.IsZero() {
		return nil, errors.New("expires_at is missing")
	}
	return &o, nil
}
