package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/quotientlabs/quotient/limiter"
)

// Log is the durable log writes go to (the compacted Kafka topic in
// production; package policysync). Append returns once r is durable; an
// error means the write may or may not have happened, and the Catalog is not
// changed by the server (the record, if written, arrives through the log's
// consumer like anyone else's). Append must be safe for concurrent use.
type Log interface {
	Append(ctx context.Context, r Record) error
}

// UsageReader reads the state of one subject under the given policies
// (already resolved: overrides applied) in every region it can reach.
// A region it cannot reach is reported with Reachable false; an error means
// no region could be read.
type UsageReader interface {
	KeyUsage(ctx context.Context, subject limiter.Subject, policies []*limiter.Policy) ([]PolicyUsage, error)
}

// PolicyUsage is the state of one subject under one policy.
type PolicyUsage struct {
	Policy    string            `json:"policy"`
	Version   int64             `json:"version"`
	Mode      limiter.Mode      `json:"mode"`
	Algorithm limiter.Algorithm `json:"algorithm"`
	Scope     limiter.Scope     `json:"scope"`
	// Override is the override in force for the subject, if any; the
	// figures below are under it.
	Override *Override `json:"override,omitempty"`
	// Regions maps region name to its view.
	Regions map[string]*RegionUsage `json:"regions"`
	// WindowStart and WindowCounts are, for global fixed windows (daily
	// quotas), the current window's start and admitted cost units per
	// region, as this region's replica holds them.
	WindowStart  *time.Time       `json:"window_start,omitempty"`
	WindowCounts map[string]int64 `json:"window_counts,omitempty"`
}

// RegionUsage is one region's state of a subject under a policy.
type RegionUsage struct {
	// Reachable is false when the region's Redis could not be read; Error
	// says why.
	Reachable bool   `json:"reachable"`
	Error     string `json:"error,omitempty"`
	// Limit and Remaining are in cost units (bucket capacity or window
	// limit); ResetAfterMs is when the quota is whole again.
	Limit        int64 `json:"limit"`
	Remaining    int64 `json:"remaining"`
	ResetAfterMs int64 `json:"reset_after_ms"`
	// Share is the region's share of a global bucket policy; nil when the
	// coordinator wrote none (the default share L/n applies).
	Share *Share `json:"share,omitempty"`
}

// Share is one region's share of a global bucket policy.
type Share struct {
	RatePerSec float64 `json:"rate_per_sec"`
	Burst      float64 `json:"burst"`
}

// Clock tells the time; nil means the system clock.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Config configures a Server.
type Config struct {
	// Catalog is the state served. Required.
	Catalog *Catalog
	// Log receives every write. Required.
	Log Log
	// Tokens authenticates callers. Required (an empty Tokens refuses
	// everyone).
	Tokens *Tokens
	// Usage answers GET /v1/keys/{key}/usage; nil answers 501.
	Usage UsageReader
	// Clock stamps writes and judges override expiry. Default: system.
	Clock Clock
	// Logger receives one line per write and per failed request.
	// Default: discard.
	Logger *slog.Logger
	// MaxBodyBytes bounds request bodies. Default 64 KiB.
	MaxBodyBytes int64
	// WriteTimeout bounds one Append. Default 10 s.
	WriteTimeout time.Duration
	// Changed, when set, is called after a write changed the Catalog (the
	// Server applies its own records at once, so a follower of the log
	// that sees them later finds nothing new and does not report a
	// change). It must not block. Default: none.
	Changed func()
}

// Server is the admin HTTP API. It is an http.Handler, safe for concurrent
// use; writes are serialised so that the version check and the append are
// one step per Server. (Two Servers — two replicas or two regions — that
// race on one version both succeed and converge on one record by the
// Catalog's tie-break; the loser's write shows in the history as replaced.)
type Server struct {
	cfg     Config
	mux     *http.ServeMux
	writeMu sync.Mutex
}

// NewServer returns a Server; it fails when a required field is missing.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Catalog == nil || cfg.Log == nil || cfg.Tokens == nil {
		return nil, errors.New("admin: config: Catalog, Log and Tokens are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = systemClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 64 << 10
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux()}
	s.route("/v1/policies", map[string]handler{"GET": s.listPolicies})
	s.route("/v1/policies/{id}", map[string]handler{"GET": s.getPolicy, "PUT": s.putPolicy, "DELETE": s.deletePolicy})
	s.route("/v1/policies/{id}/history", map[string]handler{"GET": s.history})
	s.route("/v1/policies/{id}/rollback", map[string]handler{"POST": s.rollback})
	s.route("/v1/overrides", map[string]handler{"GET": s.listOverrides, "POST": s.postOverride})
	s.route("/v1/overrides/{id}", map[string]handler{"GET": s.getOverride, "DELETE": s.deleteOverride})
	s.route("/v1/keys/{rest...}", map[string]handler{"GET": s.keyUsage})
	s.route("/v1/audit", map[string]handler{"GET": s.audit})
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, http.StatusNotFound, "no such resource", nil)
	})
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

type handler func(w http.ResponseWriter, r *http.Request, who Principal)

// route registers pattern for the given methods: GET needs the read role,
// every other method the admin role. Other methods get 405.
func (s *Server) route(pattern string, methods map[string]handler) {
	allow := make([]string, 0, len(methods))
	for m := range methods {
		allow = append(allow, m)
	}
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		h, ok := methods[r.Method]
		if !ok {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeProblem(w, r, http.StatusMethodNotAllowed, fmt.Sprintf("method %s is not allowed here", r.Method), nil)
			return
		}
		who, ok := s.authenticate(w, r)
		if !ok {
			return
		}
		need := RoleAdmin
		if r.Method == http.MethodGet {
			need = RoleRead
		}
		if !who.Role.allows(need) {
			writeProblem(w, r, http.StatusForbidden, fmt.Sprintf("%s %s needs the %s role; %q has %s", r.Method, r.URL.Path, need, who.Name, who.Role), nil)
			return
		}
		h(w, r, who)
	})
}

func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (Principal, bool) {
	h := r.Header.Get("Authorization")
	scheme, tok, _ := strings.Cut(h, " ")
	if h == "" || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		w.Header().Set("WWW-Authenticate", `Bearer realm="quotient"`)
		writeProblem(w, r, http.StatusUnauthorized, "an Authorization: Bearer <token> header is required", nil)
		return Principal{}, false
	}
	p, ok := s.cfg.Tokens.Lookup(strings.TrimSpace(tok))
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="quotient", error="invalid_token"`)
		writeProblem(w, r, http.StatusUnauthorized, "the bearer token is not valid", nil)
		return Principal{}, false
	}
	return p, true
}

// problem is an RFC 9457 problem document with two extension members.
type problem struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
	// Errors lists every invalid field or parameter.
	Errors []fieldProblem `json:"errors,omitempty"`
	// CurrentVersion is set on a version conflict.
	CurrentVersion *int64 `json:"current_version,omitempty"`
}

type fieldProblem struct {
	Field  string `json:"field"`
	Detail string `json:"detail"`
}

func writeProblem(w http.ResponseWriter, r *http.Request, status int, detail string, extra func(*problem)) {
	p := problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail, Instance: r.URL.Path}
	if extra != nil {
		extra(&p)
	}
	body, _ := json.Marshal(&p)
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// writeError maps an error of the core to its problem.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	var in *InputError
	var conflict *ConflictError
	switch {
	case errors.As(err, &in):
		detail := "the request is invalid: " + in.Fields[0].Error()
		if len(in.Fields) > 1 {
			detail += fmt.Sprintf(" (and %d more)", len(in.Fields)-1)
		}
		writeProblem(w, r, http.StatusBadRequest, detail, func(p *problem) {
			for _, f := range in.Fields {
				p.Errors = append(p.Errors, fieldProblem{Field: f.Path, Detail: f.Msg})
			}
		})
	case errors.As(err, &conflict):
		writeProblem(w, r, http.StatusConflict, conflict.Error()[len("admin: "):]+"; read it again and retry", func(p *problem) {
			p.CurrentVersion = &conflict.Current
		})
	case errors.Is(err, ErrNotFound):
		writeProblem(w, r, http.StatusNotFound, strings.TrimPrefix(err.Error(), "admin: "), nil)
	default:
		s.cfg.Logger.Error("admin: request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		writeProblem(w, r, http.StatusInternalServerError, "internal error", nil)
	}
}

// decode reads the JSON body into v strictly: one object, no unknown
// fields, no trailing data, at most MaxBodyBytes. It writes the problem
// and returns false on failure.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			writeProblem(w, r, http.StatusUnsupportedMediaType, fmt.Sprintf("Content-Type %q: send application/json", ct), nil)
			return false
		}
	}
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	data, err := io.ReadAll(body)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeProblem(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body exceeds %d bytes", s.cfg.MaxBodyBytes), nil)
			return false
		}
		writeProblem(w, r, http.StatusBadRequest, "the body could not be read", nil)
		return false
	}
	if err := duplicateKey(data); err != nil {
		s.badBody(w, r, "body", err.Error())
		return false
	}
	return s.decodeJSON(w, r, data, v)
}

// decodeJSON is decode's strict decoding of a body already read.
func (s *Server) decodeJSON(w http.ResponseWriter, r *http.Request, data []byte, v any) bool {
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &syn):
			s.badBody(w, r, "body", fmt.Sprintf("malformed JSON at byte %d: %v", syn.Offset, syn))
		case errors.As(err, &typ):
			s.badBody(w, r, typ.Field, fmt.Sprintf("must be a JSON %s, got %s", jsonType(typ.Type.Kind().String()), typ.Value))
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			name, _ := strconv.Unquote(strings.TrimPrefix(err.Error(), "json: unknown field "))
			s.badBody(w, r, name, "unknown field")
		default:
			s.badBody(w, r, "body", err.Error())
		}
		return false
	}
	if dec.More() {
		s.badBody(w, r, "body", "trailing data after the JSON object")
		return false
	}
	return true
}

func jsonType(kind string) string {
	switch kind {
	case "string":
		return "string"
	case "bool":
		return "boolean"
	case "struct", "map":
		return "object"
	case "slice", "array":
		return "array"
	}
	return "number"
}

func (s *Server) badBody(w http.ResponseWriter, r *http.Request, field, detail string) {
	s.writeError(w, r, inputErr(field, "%s", detail))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = http.StatusInternalServerError, []byte(`{"error":"encoding failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// commit appends r to the log and applies it; the caller holds writeMu.
func (s *Server) commit(w http.ResponseWriter, r *http.Request, rec Record) bool {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.WriteTimeout)
	defer cancel()
	if err := s.cfg.Log.Append(ctx, rec); err != nil {
		s.cfg.Logger.Error("admin: write not durable", "kind", rec.Kind, "id", rec.ID, "version", rec.Version, "author", rec.Author, "err", err)
		w.Header().Set("Retry-After", "5")
		writeProblem(w, r, http.StatusServiceUnavailable, "the policy log did not acknowledge the write; read the resource again before retrying", nil)
		return false
	}
	changed, err := s.cfg.Catalog.Apply(rec)
	if err != nil {
		// Prepare produced it, so this is a bug; the log holds it anyway.
		s.cfg.Logger.Error("admin: own record refused", "err", err)
	}
	if changed && s.cfg.Changed != nil {
		s.cfg.Changed()
	}
	s.cfg.Logger.Info("admin: write", "kind", rec.Kind, "id", rec.ID, "version", rec.Version, "author", rec.Author, "deleted", rec.Deleted)
	return true
}

// PolicyView is a policy version as the API shows it.
type PolicyView struct {
	ID        string          `json:"id"`
	Version   int64           `json:"version"`
	Mode      limiter.Mode    `json:"mode,omitempty"`
	Deleted   bool            `json:"deleted,omitempty"`
	Author    string          `json:"author"`
	UpdatedAt time.Time       `json:"updated_at"`
	Policy    json.RawMessage `json:"policy,omitempty"`
}

func policyView(e *Entry) PolicyView {
	v := PolicyView{ID: e.ID, Version: e.Version, Deleted: e.Deleted, Author: e.Author, UpdatedAt: e.Time()}
	if e.Policy != nil {
		v.Mode = e.Policy.Mode
		v.Policy = json.RawMessage(e.Document)
	}
	return v
}

func (s *Server) listPolicies(w http.ResponseWriter, r *http.Request, _ Principal) {
	q := r.URL.Query()
	if !onlyParams(w, r, q, "tier") {
		return
	}
	tier := q.Get("tier")
	out := []PolicyView{}
	for _, e := range s.cfg.Catalog.Policies() {
		if tier == "" || e.Policy.Match.Tier == "" || e.Policy.Match.Tier == tier {
			out = append(out, policyView(e))
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"policies": out})
}

// onlyParams refuses query parameters other than names.
func onlyParams(w http.ResponseWriter, r *http.Request, q url.Values, names ...string) bool {
	for k := range q {
		known := false
		for _, n := range names {
			known = known || k == n
		}
		if !known {
			writeProblem(w, r, http.StatusBadRequest, fmt.Sprintf("unknown query parameter %q", k), func(p *problem) {
				p.Errors = []fieldProblem{{Field: k, Detail: "unknown query parameter"}}
			})
			return false
		}
	}
	return true
}

func (s *Server) getPolicy(w http.ResponseWriter, r *http.Request, _ Principal) {
	e, ok := s.cfg.Catalog.Current(KindPolicy, r.PathValue("id"))
	if !ok || e.Deleted {
		s.writeError(w, r, fmt.Errorf("%w: policy %q", ErrNotFound, r.PathValue("id")))
		return
	}
	w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(e.Version, 10)))
	writeJSON(w, http.StatusOK, policyView(e))
}

func (s *Server) history(w http.ResponseWriter, r *http.Request, _ Principal) {
	hist := s.cfg.Catalog.History(KindPolicy, r.PathValue("id"))
	if len(hist) == 0 {
		s.writeError(w, r, fmt.Errorf("%w: policy %q", ErrNotFound, r.PathValue("id")))
		return
	}
	out := make([]PolicyView, len(hist))
	for i, e := range hist {
		out[i] = policyView(e)
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": r.PathValue("id"), "versions": out})
}

func (s *Server) putPolicy(w http.ResponseWriter, r *http.Request, who Principal) {
	var body json.RawMessage
	if !s.decode(w, r, &body) {
		return
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	req, plain, ok := s.putRequest(w, r, body)
	if !ok {
		return
	}
	rec, err := s.cfg.Catalog.PreparePut(r.PathValue("id"), req, who.Name, s.cfg.Clock.Now())
	if err != nil {
		if plain {
			err = documentPaths(err)
		}
		s.writeError(w, r, err)
		return
	}
	if !s.commit(w, r, rec) {
		return
	}
	e, _ := s.cfg.Catalog.Current(KindPolicy, rec.ID)
	status := http.StatusOK
	if rec.Version == 1 {
		status = http.StatusCreated
	}
	w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(e.Version, 10)))
	writeJSON(w, status, policyView(e))
}

func (s *Server) rollback(w http.ResponseWriter, r *http.Request, who Principal) {
	var req Rollback
	if !s.decode(w, r, &req) {
		return
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	rec, err := s.cfg.Catalog.PrepareRollback(r.PathValue("id"), req, who.Name, s.cfg.Clock.Now())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if !s.commit(w, r, rec) {
		return
	}
	e, _ := s.cfg.Catalog.Current(KindPolicy, rec.ID)
	writeJSON(w, http.StatusOK, policyView(e))
}

// expectedParam reads ?expected_version=.
func expectedParam(q url.Values) (*int64, error) {
	v := q.Get("expected_version")
	if v == "" {
		return nil, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return nil, inputErr("expected_version", "%q: must be an integer >= 0", v)
	}
	return &n, nil
}

func (s *Server) deletePolicy(w http.ResponseWriter, r *http.Request, who Principal) {
	s.deleteItem(w, r, who, KindPolicy)
}

func (s *Server) deleteOverride(w http.ResponseWriter, r *http.Request, who Principal) {
	s.deleteItem(w, r, who, KindOverride)
}

func (s *Server) deleteItem(w http.ResponseWriter, r *http.Request, who Principal, kind Kind) {
	q := r.URL.Query()
	if !onlyParams(w, r, q, "expected_version") {
		return
	}
	exp, err := expectedParam(q)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	rec, err := s.cfg.Catalog.PrepareDelete(kind, r.PathValue("id"), exp, who.Name, s.cfg.Clock.Now())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if !s.commit(w, r, rec) {
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// OverrideView is an override version as the API shows it.
type OverrideView struct {
	Override
	Version   int64     `json:"version"`
	Active    bool      `json:"active"`
	Author    string    `json:"author"`
	UpdatedAt time.Time `json:"updated_at"`
}

func overrideView(e *Entry, now time.Time) OverrideView {
	return OverrideView{Override: *e.Override, Version: e.Version, Active: e.Override.Active(now), Author: e.Author, UpdatedAt: e.Time()}
}

func (s *Server) postOverride(w http.ResponseWriter, r *http.Request, who Principal) {
	var o Override
	if !s.decode(w, r, &o) {
		return
	}
	if o.ID != "" {
		s.badBody(w, r, "id", "set by the server")
		return
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	now := s.cfg.Clock.Now()
	rec, _, err := s.cfg.Catalog.PrepareOverride(o, who.Name, now)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if !s.commit(w, r, rec) {
		return
	}
	e, _ := s.cfg.Catalog.Current(KindOverride, rec.ID)
	status := http.StatusOK
	if rec.Version == 1 {
		status = http.StatusCreated
	}
	w.Header().Set("Location", "/v1/overrides/"+rec.ID)
	writeJSON(w, status, overrideView(e, now))
}

func (s *Server) getOverride(w http.ResponseWriter, r *http.Request, _ Principal) {
	e, ok := s.cfg.Catalog.Current(KindOverride, r.PathValue("id"))
	if !ok || e.Deleted {
		s.writeError(w, r, fmt.Errorf("%w: override %q", ErrNotFound, r.PathValue("id")))
		return
	}
	writeJSON(w, http.StatusOK, overrideView(e, s.cfg.Clock.Now()))
}

func (s *Server) listOverrides(w http.ResponseWriter, r *http.Request, _ Principal) {
	q := r.URL.Query()
	if !onlyParams(w, r, q, "subject", "policy", "include_expired") {
		return
	}
	all := false
	if v := q.Get("include_expired"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			s.writeError(w, r, inputErr("include_expired", "%q: must be true or false", v))
			return
		}
		all = b
	}
	now := s.cfg.Clock.Now()
	list := s.cfg.Catalog.Overrides(now)
	if all {
		list = s.cfg.Catalog.AllOverrides()
	}
	out := []OverrideView{}
	for _, e := range list {
		if (q.Get("subject") == "" || e.Override.Subject == q.Get("subject")) && (q.Get("policy") == "" || e.Override.Policy == q.Get("policy")) {
			out = append(out, overrideView(e, now))
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"overrides": out})
}

func (s *Server) audit(w http.ResponseWriter, r *http.Request, _ Principal) {
	q := r.URL.Query()
	if !onlyParams(w, r, q, "kind", "id", "author", "since", "limit") {
		return
	}
	f := AuditFilter{Kind: Kind(q.Get("kind")), ID: q.Get("id"), Author: q.Get("author")}
	var in InputError
	if f.Kind != "" && f.Kind != KindPolicy && f.Kind != KindOverride {
		in.Fields = append(in.Fields, &limiter.FieldError{Path: "kind", Msg: fmt.Sprintf("%q: must be policy or override", f.Kind)})
	}
	if v := q.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			in.Fields = append(in.Fields, &limiter.FieldError{Path: "since", Msg: fmt.Sprintf("%q: must be an RFC 3339 time", v)})
		}
		f.Since = t
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			in.Fields = append(in.Fields, &limiter.FieldError{Path: "limit", Msg: fmt.Sprintf("%q: must be an integer from 1 to 1000", v)})
		}
		f.Limit = n
	}
	if len(in.Fields) > 0 {
		s.writeError(w, r, &in)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": nonNil(s.cfg.Catalog.Audit(f))})
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// KeyUsageView is the answer of GET /v1/keys/{key}/usage.
type KeyUsageView struct {
	Subject  string        `json:"subject"`
	Policies []PolicyUsage `json:"policies"`
}

func (s *Server) keyUsage(w http.ResponseWriter, r *http.Request, _ Principal) {
	key, ok := strings.CutSuffix(r.PathValue("rest"), "/usage")
	if !ok {
		writeProblem(w, r, http.StatusNotFound, "no such resource; did you mean /v1/keys/{key}/usage?", nil)
		return
	}
	subj, err := limiter.ParseSubjectKey(key)
	if err != nil {
		s.writeError(w, r, inputErr("key", "%q: must be a subject key such as k:<api key> (escape other bytes as %%XX): %v", key, err))
		return
	}
	if s.cfg.Usage == nil {
		writeProblem(w, r, http.StatusNotImplemented, "key usage is not configured on this coordinator", nil)
		return
	}
	now := s.cfg.Clock.Now()
	var pols []*limiter.Policy
	var entries []*Entry
	for _, e := range s.cfg.Catalog.Policies() {
		if e.Policy.Subject != subj.Kind {
			continue
		}
		p := e.Policy
		var ov *Override
		if oe, ok := s.cfg.Catalog.Current(KindOverride, OverrideID(p.ID, key)); ok && !oe.Deleted && oe.Override.Active(now) {
			if q, err := oe.Override.Apply(p); err == nil {
				p, ov = q, oe.Override
			}
		}
		pols = append(pols, p)
		entries = append(entries, &Entry{Record: e.Record, Policy: p, Override: ov})
	}
	out := KeyUsageView{Subject: key, Policies: []PolicyUsage{}}
	if len(pols) > 0 {
		us, err := s.cfg.Usage.KeyUsage(r.Context(), subj, pols)
		if err != nil {
			s.cfg.Logger.Warn("admin: key usage unavailable", "key", key, "err", err)
			w.Header().Set("Retry-After", "1")
			writeProblem(w, r, http.StatusServiceUnavailable, "no region's store could be read", nil)
			return
		}
		for i := range us {
			us[i].Version, us[i].Mode = entries[i].Version, entries[i].Policy.Mode
			us[i].Algorithm, us[i].Scope = entries[i].Policy.Algorithm, entries[i].Policy.Scope
			us[i].Override = entries[i].Override
		}
		out.Policies = us
	}
	writeJSON(w, http.StatusOK, out)
}
