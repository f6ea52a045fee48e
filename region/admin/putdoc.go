package admin

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/quotientlabs/quotient/limiter"
)

// PUT /v1/policies/{id} takes either body:
//
//   - the wrapped form, {"expected_version": N, "enforce": bool, "policy":
//     {...}}, as the CLI sends it;
//   - the policy document itself, as users write it (seed design 4.3:
//     `curl -X PUT --data @pro.json`), with optimistic concurrency through
//     HTTP's conditional requests instead of expected_version: If-Match:
//     "N" (the ETag of version N) replaces exactly version N, 412 otherwise;
//     If-None-Match: * only creates, 412 if the policy exists; neither header
//     writes the next version unconditionally.
//
// In a document, "version" is the writer's own count and a staleness
// check: when given it must be above the version in force (a document
// edited from an older version gets 409); the server still numbers
// versions itself (in force + 1). "mode" combines with the reviewer's
// decision as the shadow-first rule wants: a new version starts in shadow
// unless the request says ?enforce=true, and a document whose mode is
// "shadow" stays in shadow even then. The response's ETag is the version
// written.

// wrappedKeys are the top-level fields of the wrapped form.
var wrappedKeys = []string{"expected_version", "enforce", "policy"}

// putRequest turns a PUT body into a PutPolicy (plain: the body was the
// document itself), writing the problem and returning ok false on bad
// input or a failed precondition. The caller holds
// writeMu, so the preconditions and the write are one step.
func (s *Server) putRequest(w http.ResponseWriter, r *http.Request, body json.RawMessage) (req PutPolicy, plain, ok bool) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil || top == nil {
		s.badBody(w, r, "body", "not a JSON object: send a policy document or {\"expected_version\", \"enforce\", \"policy\"}")
		return PutPolicy{}, false, false
	}
	for _, k := range wrappedKeys {
		if _, ok := top[k]; ok {
			return req, false, s.decodeJSON(w, r, body, &req)
		}
	}
	id := r.PathValue("id")
	cur := currentVersion(s.cfg.Catalog.Current(KindPolicy, id))
	expected := cur
	if m := r.Header.Get("If-Match"); m != "" {
		n, err := parseETag(m)
		if err != nil {
			s.badBody(w, r, "If-Match", err.Error())
			return PutPolicy{}, false, false
		}
		if n != cur {
			precondition(w, r, fmt.Sprintf("If-Match %s: version %d is in force", m, cur), cur)
			return PutPolicy{}, false, false
		}
	}
	if m := r.Header.Get("If-None-Match"); m != "" {
		if strings.TrimSpace(m) != "*" {
			s.badBody(w, r, "If-None-Match", fmt.Sprintf("%q: only * (create only) is supported", m))
			return PutPolicy{}, false, false
		}
		if cur != 0 {
			precondition(w, r, fmt.Sprintf("If-None-Match *: policy %q exists at version %d", id, cur), cur)
			return PutPolicy{}, false, false
		}
	}
	var in InputError
	if raw, ok := top["version"]; ok {
		var v int64
		switch err := json.Unmarshal(raw, &v); {
		case err != nil || v < 0:
			in.Fields = append(in.Fields, fieldErr("version", "must be an integer >= 0"))
		case v <= cur:
			writeProblem(w, r, http.StatusConflict, fmt.Sprintf("the document's version %d is not above version %d in force: it was edited from an older version; read it again and retry", v, cur), func(p *problem) { p.CurrentVersion = &cur })
			return PutPolicy{}, false, false
		}
		delete(top, "version")
	}
	shadowDoc := false
	if raw, ok := top["mode"]; ok {
		var mode string
		if err := json.Unmarshal(raw, &mode); err != nil || (mode != "shadow" && mode != "enforce") {
			in.Fields = append(in.Fields, fieldErr("mode", "must be \"enforce\" or \"shadow\""))
		}
		shadowDoc = mode == "shadow"
		delete(top, "mode")
	}
	enforce := false
	if q := r.URL.Query().Get("enforce"); q != "" {
		b, err := strconv.ParseBool(q)
		if err != nil {
			in.Fields = append(in.Fields, fieldErr("enforce", fmt.Sprintf("%q: want true or false", q)))
		}
		enforce = b && !shadowDoc
	}
	if len(in.Fields) > 0 {
		s.writeError(w, r, &in)
		return PutPolicy{}, false, false
	}
	doc, _ := json.Marshal(top)
	return PutPolicy{ExpectedVersion: &expected, Enforce: enforce, Policy: doc}, true, true
}

// documentPaths names the fields of a plain document as the body's own
// (the catalog names them under "policy.", as in the wrapped form).
func documentPaths(err error) error {
	in, ok := err.(*InputError)
	if !ok {
		return err
	}
	out := &InputError{}
	for _, f := range in.Fields {
		out.Fields = append(out.Fields, fieldErr(strings.TrimPrefix(f.Path, "policy."), f.Msg))
	}
	return out
}

// parseETag reads the version out of an ETag: "N" (or N, or W/"N").
func parseETag(tag string) (int64, error) {
	t := strings.TrimPrefix(strings.TrimSpace(tag), "W/")
	t = strings.Trim(t, `"`)
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q: want the ETag of a version, like \"3\"", tag)
	}
	return n, nil
}

// precondition answers 412 with the version in force.
func precondition(w http.ResponseWriter, r *http.Request, detail string, cur int64) {
	w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(cur, 10)))
	writeProblem(w, r, http.StatusPreconditionFailed, detail+"; read it again and retry", func(p *problem) { p.CurrentVersion = &cur })
}

func fieldErr(path, msg string) *limiter.FieldError { return &limiter.FieldError{Path: path, Msg: msg} }
