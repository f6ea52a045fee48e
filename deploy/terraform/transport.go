package terraform

import (
	"fmt"
	"slices"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// CheckNameTransport names the problems CheckTransportSecurity reports.
const CheckNameTransport = "transport-security"

// TLSRequirement is one resource that requires its clients to secure their
// connections, and the coordinator setting that must then be passed.
type TLSRequirement struct {
	Resource string // e.g. aws_elasticache_replication_group.this
	File     string
	Line     int
	Why      string // e.g. "transit_encryption_enabled = true"
	Setting  string // e.g. QUOTIENT_REDIS_TLS
}

// TransportRequirements reads the resources of the .tf files in dirs that
// require secured clients:
//   - aws_elasticache_replication_group with transit_encryption_enabled =
//     true: QUOTIENT_REDIS_TLS;
//   - aws_msk_cluster whose encryption_in_transit.client_broker is "TLS"
//     (MSK's default when the block is absent) or computed:
//     QUOTIENT_KAFKA_TLS;
//   - aws_msk_cluster with client_authentication.sasl.scram set (to
//     anything but false): QUOTIENT_KAFKA_SASL.
//
// A value computed at plan time counts as set: the module may switch it on.
func TransportRequirements(dirs ...string) ([]TLSRequirement, error) {
	var out []TLSRequirement
	for _, dir := range dirs {
		bodies, err := parseDir(dir)
		if err != nil {
			return nil, err
		}
		for _, fb := range bodies {
			for _, b := range fb.body.Blocks {
				if b.Type != "resource" || len(b.Labels) != 2 {
					continue
				}
				name := b.Labels[0] + "." + b.Labels[1]
				line := b.DefRange().Start.Line
				switch b.Labels[0] {
				case "aws_elasticache_replication_group":
					if attrNotFalse(b.Body, "transit_encryption_enabled", false) {
						out = append(out, TLSRequirement{name, fb.file, line, "transit_encryption_enabled = true", "QUOTIENT_REDIS_TLS"})
					}
				case "aws_msk_cluster":
					transit := nested(b.Body, "encryption_info", "encryption_in_transit")
					if cb := attrString(transit, "client_broker", "TLS"); cb == "TLS" || cb == "" {
						out = append(out, TLSRequirement{name, fb.file, line, `client_broker = "TLS"`, "QUOTIENT_KAFKA_TLS"})
					}
					if sasl := nested(b.Body, "client_authentication", "sasl"); sasl != nil && attrNotFalse(sasl, "scram", false) {
						out = append(out, TLSRequirement{name, fb.file, line, "client_authentication.sasl.scram", "QUOTIENT_KAFKA_SASL"})
					}
				}
			}
		}
	}
	return out, nil
}

// CheckTransportSecurity reports every requirement of the resources in
// resourceDirs (see TransportRequirements) whose setting the coordinator
// module coordinatorDir does not pass, and, when that module serves the
// admin API (it passes QUOTIENT_ADMIN_TOKENS_FILE), a listener without
// QUOTIENT_LISTEN_TLS_CERT and QUOTIENT_LISTEN_TLS_KEY (unless it passes
// QUOTIENT_ADMIN_INSECURE): the coordinator refuses to serve bearer tokens
// in the clear on a non-loopback address. So a module that turns TLS on
// for a resource and forgets to tell the binary fails offline, not at
// deploy time.
func CheckTransportSecurity(coordinatorDir string, resourceDirs ...string) ([]Problem, error) {
	settings, err := CoordinatorEnv(coordinatorDir)
	if err != nil {
		return nil, err
	}
	passed := map[string]bool{}
	for _, s := range settings {
		passed[s.Name] = true
	}
	reqs, err := TransportRequirements(resourceDirs...)
	if err != nil {
		return nil, err
	}
	var problems []Problem
	for _, r := range reqs {
		if !passed[r.Setting] {
			problems = append(problems, Problem{CheckNameTransport, r.File, r.Line,
				fmt.Sprintf("%s requires secured clients (%s) but %s does not pass %s to the coordinator", r.Resource, r.Why, coordinatorDir, r.Setting)})
		}
	}
	if passed["QUOTIENT_ADMIN_TOKENS_FILE"] && !passed["QUOTIENT_ADMIN_INSECURE"] {
		for _, s := range []string{"QUOTIENT_LISTEN_TLS_CERT", "QUOTIENT_LISTEN_TLS_KEY"} {
			if !passed[s] {
				problems = append(problems, Problem{CheckNameTransport, coordinatorDir, 0,
					fmt.Sprintf("the admin API is on (QUOTIENT_ADMIN_TOKENS_FILE) but %s is not passed: the coordinator refuses bearer tokens in the clear", s)})
			}
		}
	}
	slices.SortStableFunc(problems, func(a, b Problem) int {
		if a.File != b.File {
			if a.File < b.File {
				return -1
			}
			return 1
		}
		return a.Line - b.Line
	})
	return problems, nil
}

// nested returns the body of the first block path[0] > path[1] > ..., or nil.
func nested(body *hclsyntax.Body, path ...string) *hclsyntax.Body {
	for _, name := range path {
		var next *hclsyntax.Body
		for _, b := range body.Blocks {
			if b.Type == name {
				next = b.Body
				break
			}
		}
		if next == nil {
			return nil
		}
		body = next
	}
	return body
}

// attrNotFalse reports whether the attribute is set to something other
// than the literal false; absent gives def.
func attrNotFalse(body *hclsyntax.Body, name string, def bool) bool {
	a, ok := body.Attributes[name]
	if !ok {
		return def
	}
	v, diags := a.Expr.Value(nil)
	if diags.HasErrors() || !v.IsKnown() || v.Type() != cty.Bool {
		return true // computed: may be on
	}
	return v.True()
}

// attrString returns a literal string attribute, def when absent (or the
// body is nil), and "" when computed at plan time.
func attrString(body *hclsyntax.Body, name, def string) string {
	if body == nil {
		return def
	}
	a, ok := body.Attributes[name]
	if !ok {
		return def
	}
	v, diags := a.Expr.Value(&hcl.EvalContext{})
	if diags.HasErrors() || !v.IsKnown() || v.Type() != cty.String {
		return ""
	}
	return v.AsString()
}
