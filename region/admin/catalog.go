package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/quotientlabs/quotient/limiter"
)

// Entry is one version held by the Catalog: the record and its parsed
// document. Entries are immutable once in the Catalog.
type Entry struct {
	Record
	// Policy is the parsed policy (KindPolicy, not Deleted).
	Policy *limiter.Policy
	// Override is the parsed override (KindOverride, not Deleted).
	Override *Override
}

// AuditEntry is one write, as the audit log shows it.
type AuditEntry struct {
	// Seq numbers entries in the order this Catalog applied them, from 1.
	Seq    int64  `json:"seq"`
	Kind   Kind   `json:"kind"`
	ID     string `json:"id"`
	Action string `json:"action"` // create, update or delete
	// Version written.
	Version int64 `json:"version"`
	// Author is who wrote it, At when (RFC 3339, UTC).
	Author string    `json:"author"`
	At     time.Time `json:"at"`
	// Before is the document of the version below (null when none or
	// deleted); After the document written (null for a delete).
	Before json.RawMessage `json:"before"`
	After  json.RawMessage `json:"after"`
}

type itemKey struct {
	kind Kind
	id   string
}

// Catalog holds every version of every policy and override, and the audit
// log. The zero value is not usable; use NewCatalog. It is safe for
// concurrent use; Apply never blocks on I/O.
type Catalog struct {
	mu    sync.RWMutex
	items map[itemKey][]*Entry // ascending version
	audit []AuditEntry
	gen   int64
}

// NewCatalog returns an empty Catalog.
func NewCatalog() *Catalog {
	return &Catalog{items: map[itemKey][]*Entry{}}
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// Apply adds r and reports whether it changed the Catalog. A record already
// held (same kind, id and version) changes nothing unless it wins the
// tie-break of concurrent writers (see Record.after), in which case it
// replaces the one held. A record that cannot be parsed is refused with an
// error wrapping ErrBadRecord, and changes nothing.
func (c *Catalog) Apply(r Record) (bool, error) {
	e, err := parseRecord(r)
	if err != nil {
		return false, err
	}
	k := itemKey{r.Kind, r.ID}
	c.mu.Lock()
	defer c.mu.Unlock()
	vs := c.items[k]
	i := sort.Search(len(vs), func(i int) bool { return vs[i].Version >= r.Version })
	if i < len(vs) && vs[i].Version == r.Version {
		if vs[i].same(r) || !r.after(vs[i].Record) {
			return false, nil
		}
		vs[i] = e
	} else {
		vs = append(vs, nil)
		copy(vs[i+1:], vs[i:])
		vs[i] = e
		c.items[k] = vs
		if i == len(vs)-1 {
			c.gen += r.Version - prevVersion(vs, i)
		}
	}
	var before json.RawMessage
	if i > 0 && !vs[i-1].Deleted {
		before = json.RawMessage(vs[i-1].Document)
	}
	a := AuditEntry{
		Seq: int64(len(c.audit)) + 1, Kind: r.Kind, ID: r.ID, Version: r.Version,
		Author: r.Author, At: r.Time(), Before: before, Action: "update",
	}
	switch {
	case r.Deleted:
		a.Action = "delete"
	case before == nil:
		a.Action = "create"
	}
	if !r.Deleted {
		a.After = json.RawMessage(r.Document)
	}
	c.audit = append(c.audit, a)
	return true, nil
}

func prevVersion(vs []*Entry, i int) int64 {
	if i == 0 {
		return 0
	}
	return vs[i-1].Version
}

func parseRecord(r Record) (*Entry, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s %q version %d: %s", ErrBadRecord, r.Kind, r.ID, r.Version, fmt.Sprintf(format, args...))
	}
	if r.Kind != KindPolicy && r.Kind != KindOverride {
		return nil, bad("unknown kind")
	}
	if r.Kind == KindPolicy && !idPattern.MatchString(r.ID) || r.ID == "" {
		return nil, bad("bad id")
	}
	if r.Version < 1 {
		return nil, bad("version must be >= 1")
	}
	e := &Entry{Record: r}
	e.Document = bytes.Clone(r.Document)
	if r.Deleted {
		if len(r.Document) != 0 {
			return nil, bad("a tombstone carries no document")
		}
		return e, nil
	}
	switch r.Kind {
	case KindPolicy:
		p, err := limiter.ParsePolicy(r.Document)
		if err != nil {
			return nil, bad("%v", err)
		}
		if p.ID != r.ID || p.Version != r.Version {
			return nil, bad("document has id %q version %d", p.ID, p.Version)
		}
		e.Policy = p
	case KindOverride:
		o, err := parseOverride(r.Document)
		if err != nil {
			return nil, bad("%v", err)
		}
		if o.ID != r.ID {
			return nil, bad("document has id %q", o.ID)
		}
		e.Override = o
	}
	return e, nil
}

// Generation is the sum over every (kind, id) of its highest version. It
// grows with every new version and is the same in two Catalogs that hold the
// same versions, whatever order they arrived in.
func (c *Catalog) Generation() int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.gen
}

// Current is the version in force of (kind, id), tombstones included; false
// when the Catalog has no version of it.
func (c *Catalog) Current(kind Kind, id string) (*Entry, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	vs := c.items[itemKey{kind, id}]
	if len(vs) == 0 {
		return nil, false
	}
	return vs[len(vs)-1], true
}

// History is every version of (kind, id), newest first.
func (c *Catalog) History(kind Kind, id string) []*Entry {
	c.mu.RLock()
	defer c.mu.RUnlock()
	vs := c.items[itemKey{kind, id}]
	out := make([]*Entry, len(vs))
	for i, e := range vs {
		out[len(vs)-1-i] = e
	}
	return out
}

// Version returns one version of (kind, id).
func (c *Catalog) Version(kind Kind, id string, version int64) (*Entry, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	vs := c.items[itemKey{kind, id}]
	i := sort.Search(len(vs), func(i int) bool { return vs[i].Version >= version })
	if i < len(vs) && vs[i].Version == version {
		return vs[i], true
	}
	return nil, false
}

// Policies are the policies in force (not deleted), by id.
func (c *Catalog) Policies() []*Entry {
	return c.current(KindPolicy, func(*Entry) bool { return true })
}

// Overrides are the overrides in force at now (not deleted, not expired),
// by id.
func (c *Catalog) Overrides(now time.Time) []*Entry {
	return c.current(KindOverride, func(e *Entry) bool { return e.Override.Active(now) })
}

// AllOverrides are the overrides not deleted, expired ones included, by id.
func (c *Catalog) AllOverrides() []*Entry {
	return c.current(KindOverride, func(*Entry) bool { return true })
}

func (c *Catalog) current(kind Kind, keep func(*Entry) bool) []*Entry {
	c.mu.RLock()
	var out []*Entry
	for k, vs := range c.items {
		if k.kind != kind {
			continue
		}
		e := vs[len(vs)-1]
		if !e.Deleted && keep(e) {
			out = append(out, e)
		}
	}
	c.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// AuditFilter selects audit entries; empty fields match everything.
type AuditFilter struct {
	Kind   Kind
	ID     string
	Author string
	// Since keeps entries written at or after it (zero: all).
	Since time.Time
	// Limit bounds the answer (newest first); 0 means 100.
	Limit int
}

// Audit returns the entries matching f, newest first.
func (c *Catalog) Audit(f AuditFilter) []AuditEntry {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []AuditEntry
	for i := len(c.audit) - 1; i >= 0 && len(out) < f.Limit; i-- {
		a := c.audit[i]
		if (f.Kind == "" || a.Kind == f.Kind) && (f.ID == "" || a.ID == f.ID) &&
			(f.Author == "" || a.Author == f.Author) && !a.At.Before(f.Since) {
			out = append(out, a)
		}
	}
	return out
}

// Errors of the Prepare methods, for callers to branch on.
var (
	// ErrInvalidInput wraps *InputError.
	ErrInvalidInput = errors.New("admin: invalid input")
	// ErrConflict wraps *ConflictError.
	ErrConflict = errors.New("admin: version conflict")
	// ErrNotFound: the policy, override or version does not exist.
	ErrNotFound = errors.New("admin: not found")
)

// InputError lists every problem of a request, each at a JSON path or a
// parameter name.
type InputError struct {
	Fields []*limiter.FieldError
}

func (e *InputError) Error() string {
	parts := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		parts[i] = f.Error()
	}
	return "admin: invalid input: " + strings.Join(parts, "; ")
}

// Unwrap makes errors.Is(err, ErrInvalidInput) hold.
func (e *InputError) Unwrap() error { return ErrInvalidInput }

func inputErr(path, format string, args ...any) *InputError {
	return &InputError{Fields: []*limiter.FieldError{{Path: path, Msg: fmt.Sprintf(format, args...)}}}
}

// ConflictError says the request expected another version than the one in
// force.
type ConflictError struct {
	Expected, Current int64
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("admin: version conflict: expected version %d, current version is %d", e.Expected, e.Current)
}

// Unwrap makes errors.Is(err, ErrConflict) hold.
func (e *ConflictError) Unwrap() error { return ErrConflict }

// PutPolicy is the body of PUT /v1/policies/{id}.
type PutPolicy struct {
	// ExpectedVersion is the version the writer saw, 0 to create
	// (or to re-create a deleted policy: then the tombstone's version).
	// Required.
	ExpectedVersion *int64 `json:"expected_version"`
	// Enforce makes the new version enforce at once; by default it starts
	// in shadow mode.
	Enforce bool `json:"enforce"`
	// Policy is the limiter policy document, without version and mode (the
	// server sets them); its id, if present, must be the path's.
	Policy json.RawMessage `json:"policy"`
}

func currentVersion(e *Entry, ok bool) int64 {
	if !ok {
		return 0
	}
	return e.Version
}

func checkExpected(path string, expected *int64, current int64) error {
	if expected == nil {
		return inputErr(path, "required: the version you are replacing (0 to create)")
	}
	if *expected < 0 {
		return inputErr(path, "must be >= 0, got %d", *expected)
	}
	if *expected != current {
		return &ConflictError{Expected: *expected, Current: current}
	}
	return nil
}

// PreparePut checks a PUT of policy id and returns the record to append.
// Errors: *InputError (ErrInvalidInput), *ConflictError (ErrConflict).
func (c *Catalog) PreparePut(id string, req PutPolicy, author string, now time.Time) (Record, error) {
	if !idPattern.MatchString(id) {
		return Record{}, inputErr("id", "%q: must be 1 to 64 characters of A-Z a-z 0-9 . _ -", id)
	}
	if len(bytes.TrimSpace(req.Policy)) == 0 || string(bytes.TrimSpace(req.Policy)) == "null" {
		return Record{}, inputErr("policy", "required")
	}
	if err := duplicateKey(req.Policy); err != nil {
		return Record{}, inputErr("policy", "%v", err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(req.Policy, &m); err != nil || m == nil {
		return Record{}, inputErr("policy", "not a JSON object")
	}
	var in InputError
	if raw, ok := m["id"]; ok {
		var got string
		if json.Unmarshal(raw, &got) != nil || got != id {
			in.Fields = append(in.Fields, &limiter.FieldError{Path: "policy.id", Msg: fmt.Sprintf("must be %q (the path) or absent", id)})
		}
	}
	if _, ok := m["version"]; ok {
		in.Fields = append(in.Fields, &limiter.FieldError{Path: "policy.version", Msg: "set by the server; send expected_version instead"})
	}
	if _, ok := m["mode"]; ok {
		in.Fields = append(in.Fields, &limiter.FieldError{Path: "policy.mode", Msg: "set by the server; send enforce: true to enforce"})
	}
	if req.ExpectedVersion == nil {
		in.Fields = append(in.Fields, &limiter.FieldError{Path: "expected_version", Msg: "required: the version you are replacing (0 to create)"})
	}
	if len(in.Fields) > 0 {
		return Record{}, &in
	}
	cur := currentVersion(c.Current(KindPolicy, id))
	mode := limiter.Shadow
	if req.Enforce {
		mode = limiter.Enforce
	}
	m["id"], _ = json.Marshal(id)
	m["version"], _ = json.Marshal(cur + 1)
	m["mode"], _ = json.Marshal(mode)
	doc, _ := json.Marshal(m)
	if _, err := limiter.ParsePolicy(doc); err != nil {
		var pe *limiter.PolicyError
		if errors.As(err, &pe) {
			return Record{}, &InputError{Fields: pe.Fields}
		}
		return Record{}, inputErr("policy", "%v", err)
	}
	if err := checkExpected("expected_version", req.ExpectedVersion, cur); err != nil {
		return Record{}, err
	}
	return Record{Kind: KindPolicy, ID: id, Version: cur + 1, Document: doc, Author: author, UnixMs: now.UnixMilli()}, nil
}

// Rollback is the body of POST /v1/policies/{id}/rollback.
type Rollback struct {
	// ToVersion is the version whose document the new version restores
	// (its mode included). Required.
	ToVersion int64 `json:"to_version"`
	// ExpectedVersion is the version in force the writer saw. Required.
	ExpectedVersion *int64 `json:"expected_version"`
}

// PrepareRollback checks a rollback of policy id and returns the record
// to append: version current+1 with the document of req.ToVersion.
func (c *Catalog) PrepareRollback(id string, req Rollback, author string, now time.Time) (Record, error) {
	cur, ok := c.Current(KindPolicy, id)
	if !ok {
		return Record{}, fmt.Errorf("%w: policy %q", ErrNotFound, id)
	}
	if req.ToVersion < 1 {
		return Record{}, inputErr("to_version", "required, >= 1")
	}
	old, ok := c.Version(KindPolicy, id, req.ToVersion)
	if !ok {
		return Record{}, inputErr("to_version", "policy %q has no version %d", id, req.ToVersion)
	}
	if old.Deleted {
		return Record{}, inputErr("to_version", "version %d of policy %q is a deletion", req.ToVersion, id)
	}
	if err := checkExpected("expected_version", req.ExpectedVersion, cur.Version); err != nil {
		return Record{}, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(old.Document, &m); err != nil {
		return Record{}, fmt.Errorf("admin: stored document of %q version %d: %w", id, old.Version, err)
	}
	m["version"], _ = json.Marshal(cur.Version + 1)
	doc, _ := json.Marshal(m)
	return Record{Kind: KindPolicy, ID: id, Version: cur.Version + 1, Document: doc, Author: author, UnixMs: now.UnixMilli()}, nil
}

// PrepareDelete returns the tombstone of policy or override (kind, id).
// expected is required for policies; for overrides nil means "whatever is
// in force".
func (c *Catalog) PrepareDelete(kind Kind, id string, expected *int64, author string, now time.Time) (Record, error) {
	cur, ok := c.Current(kind, id)
	if !ok || cur.Deleted {
		return Record{}, fmt.Errorf("%w: %s %q", ErrNotFound, kind, id)
	}
	if kind == KindPolicy || expected != nil {
		if err := checkExpected("expected_version", expected, cur.Version); err != nil {
			return Record{}, err
		}
	}
	return Record{Kind: kind, ID: id, Version: cur.Version + 1, Deleted: true, Author: author, UnixMs: now.UnixMilli()}, nil
}

// MaxOverrideTTL bounds how far in the future an override may expire.
const MaxOverrideTTL = 366 * 24 * time.Hour

// PrepareOverride checks a new override (o.ID is ignored and set) and
// returns the record to append. The policy must be in force, the subject of
// the policy's subject kind, the limits valid for the policy's algorithm,
// and the expiry after now and at most MaxOverrideTTL ahead. Posting the
// override of an existing (policy, subject) writes its next version.
func (c *Catalog) PrepareOverride(o Override, author string, now time.Time) (Record, *Override, error) {
	var in InputError
	add := func(path, format string, args ...any) {
		in.Fields = append(in.Fields, &limiter.FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
	}
	var subj limiter.Subject
	if !subjectPattern.MatchString(o.Subject) {
		add("subject", "%q: must be k:<api key>, a:<account>, u:<user> or ip:<address>, as in limiter subject keys", o.Subject)
	} else if s, err := limiter.ParseSubjectKey(o.Subject); err != nil {
		add("subject", "%v", err)
	} else {
		subj = s
	}
	var pol *limiter.Policy
	if o.Policy == "" {
		add("policy", "required")
	} else if e, ok := c.Current(KindPolicy, o.Policy); !ok || e.Deleted {
		add("policy", "%q: no such policy", o.Policy)
	} else {
		pol = e.Policy
	}
	if o.ExpiresAt.IsZero() {
		add("expires_at", "required (RFC 3339)")
	} else if !o.ExpiresAt.After(now) {
		add("expires_at", "%s is not in the future", o.ExpiresAt.UTC().Format(time.RFC3339))
	} else if o.ExpiresAt.Sub(now) > MaxOverrideTTL {
		add("expires_at", "more than %v ahead", MaxOverrideTTL)
	}
	if o.RatePerSec < 0 || o.Burst < 0 || o.Limit < 0 {
		add("rate_per_sec", "rate_per_sec, burst and limit must be >= 0")
	}
	if o.RatePerSec == 0 && o.Burst == 0 && o.Limit == 0 {
		add("limit", "an override sets rate_per_sec and/or burst (buckets) or limit (windows)")
	}
	if len(o.Reason) > 1024 {
		add("reason", "at most 1024 bytes")
	}
	if pol != nil && subj.Kind != "" && subj.Kind != pol.Subject {
		add("subject", "policy %q limits %s subjects, not %s", pol.ID, pol.Subject, subj.Kind)
	}
	if len(in.Fields) > 0 {
		return Record{}, nil, &in
	}
	if _, err := o.Apply(pol); err != nil {
		var pe *limiter.PolicyError
		if errors.As(err, &pe) {
			for _, f := range pe.Fields {
				add(strings.TrimPrefix(f.Path, "policy."), "%s", f.Msg)
			}
			return Record{}, nil, &in
		}
		return Record{}, nil, inputErr("override", "%v", err)
	}
	o.ID = OverrideID(o.Policy, o.Subject)
	o.ExpiresAt = o.ExpiresAt.UTC()
	doc, _ := json.Marshal(&o)
	cur := currentVersion(c.Current(KindOverride, o.ID))
	return Record{Kind: KindOverride, ID: o.ID, Version: cur + 1, Document: doc, Author: author, UnixMs: now.UnixMilli()}, &o, nil
}

// duplicateKey reports a repeated member of the top-level JSON object.
func duplicateKey(raw []byte) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("malformed JSON: %v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return errors.New("not a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("malformed JSON: %v", err)
		}
		k, _ := tok.(string)
		if seen[k] {
			return fmt.Errorf("field %q appears twice", k)
		}
		seen[k] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return fmt.Errorf("malformed JSON: %v", err)
		}
	}
	return nil
}
