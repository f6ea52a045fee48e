package terraform

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/hcl/v2/hclwrite"
	"github.com/hashicorp/terraform-config-inspect/tfconfig"
	"github.com/zclconf/go-cty/cty"
)

// ErrNotModule is returned (wrapped) when a directory holds no .tf file.
var ErrNotModule = errors.New("terraform: not a module directory")

// Check names, used in Problem.Check.
const (
	CheckNameSyntax      = "syntax"
	CheckNameVariables   = "variables"
	CheckNameFormat      = "format"
	CheckNameWiring      = "wiring"
	CheckNameReadme      = "readme"
	CheckNameCoordinator = "coordinator-env"
)

// Problem is one thing a check found wrong.
type Problem struct {
	Check   string // which check found it: one of the CheckName constants
	File    string // the file, as a path joined to the directory given to the check
	Line    int    // 1-based line; 0 when the problem concerns the whole file or module
	Message string // what is wrong, naming the variable, argument or setting
}

func (p Problem) String() string {
	if p.Line > 0 {
		return fmt.Sprintf("%s:%d: %s: %s", p.File, p.Line, p.Check, p.Message)
	}
	return fmt.Sprintf("%s: %s: %s", p.File, p.Check, p.Message)
}

// tfFiles lists the .tf files of dir, sorted. It fails with ErrNotModule if
// there are none.
func tfFiles(dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.tf"))
	if err != nil {
		return nil, fmt.Errorf("terraform: list %s: %w", dir, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%w: %s has no .tf file", ErrNotModule, dir)
	}
	sort.Strings(files)
	return files, nil
}

// loadModule loads dir with terraform-config-inspect, turning its error
// diagnostics into syntax problems.
func loadModule(dir string) (*tfconfig.Module, []Problem, error) {
	if _, err := tfFiles(dir); err != nil {
		return nil, nil, err
	}
	mod, diags := tfconfig.LoadModule(dir)
	var problems []Problem
	for _, d := range diags {
		if d.Severity != tfconfig.DiagError {
			continue
		}
		p := Problem{Check: CheckNameSyntax, File: dir, Message: strings.TrimSpace(d.Summary + ": " + d.Detail)}
		if d.Pos != nil {
			p.File, p.Line = d.Pos.Filename, d.Pos.Line
		}
		problems = append(problems, p)
	}
	return mod, problems, nil
}

// CheckVariables loads the module in dir and reports every variable without
// a type or a description, every output without a description, and every
// file that does not parse.
func CheckVariables(dir string) ([]Problem, error) {
	mod, problems, err := loadModule(dir)
	if err != nil {
		return nil, err
	}
	for _, name := range sortedKeys(mod.Variables) {
		v := mod.Variables[name]
		if strings.TrimSpace(v.Type) == "" {
			problems = append(problems, Problem{CheckNameVariables, v.Pos.Filename, v.Pos.Line, fmt.Sprintf("variable %q has no type", name)})
		}
		if strings.TrimSpace(v.Description) == "" {
			problems = append(problems, Problem{CheckNameVariables, v.Pos.Filename, v.Pos.Line, fmt.Sprintf("variable %q has no description", name)})
		}
	}
	for _, name := range sortedKeys(mod.Outputs) {
		o := mod.Outputs[name]
		if strings.TrimSpace(o.Description) == "" {
			problems = append(problems, Problem{CheckNameVariables, o.Pos.Filename, o.Pos.Line, fmt.Sprintf("output %q has no description", name)})
		}
	}
	return problems, nil
}

// CheckFormat reports every .tf file in dir that is not in canonical HCL
// format, with the first line that differs.
func CheckFormat(dir string) ([]Problem, error) {
	files, err := tfFiles(dir)
	if err != nil {
		return nil, err
	}
	var problems []Problem
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("terraform: read %s: %w", f, err)
		}
		formatted := hclwrite.Format(src)
		if bytes.Equal(src, formatted) {
			continue
		}
		line := firstDifferentLine(src, formatted)
		problems = append(problems, Problem{CheckNameFormat, f, line, "not in canonical format (run hclfmt -w or terraform fmt)"})
	}
	return problems, nil
}

func firstDifferentLine(a, b []byte) int {
	la, lb := bytes.Split(a, []byte("\n")), bytes.Split(b, []byte("\n"))
	for i := 0; i < len(la) && i < len(lb); i++ {
		if !bytes.Equal(la[i], lb[i]) {
			return i + 1
		}
	}
	return min(len(la), len(lb)) + 1
}

// moduleMetaArgs are the arguments of a module block that are not inputs.
var moduleMetaArgs = []string{"source", "version", "providers", "count", "for_each", "depends_on"}

// CheckWiring reports, for every call in dir of a module with a local
// source (./ or ../), each input that the called module requires (it has
// no default) and the call does not pass, and each argument the call
// passes that the called module does not declare. Calls of registry or
// remote modules are not checked.
func CheckWiring(dir string) ([]Problem, error) {
	mod, problems, err := loadModule(dir)
	if err != nil {
		return nil, err
	}
	calls, err := moduleCallArgs(dir)
	if err != nil {
		return nil, err
	}
	for _, name := range sortedKeys(mod.ModuleCalls) {
		mc := mod.ModuleCalls[name]
		if !strings.HasPrefix(mc.Source, "./") && !strings.HasPrefix(mc.Source, "../") {
			continue
		}
		call := calls[name]
		child, _, err := loadModule(filepath.Join(dir, mc.Source))
		if err != nil {
			problems = append(problems, Problem{CheckNameWiring, mc.Pos.Filename, mc.Pos.Line, fmt.Sprintf("module %q: source %q: %v", name, mc.Source, err)})
			continue
		}
		for _, in := range sortedKeys(child.Variables) {
			if child.Variables[in].Required && !call.args[in] {
				problems = append(problems, Problem{CheckNameWiring, mc.Pos.Filename, mc.Pos.Line, fmt.Sprintf("module %q does not pass required input %q of %s", name, in, mc.Source)})
			}
		}
		for _, arg := range sortedKeys(call.args) {
			if _, ok := child.Variables[arg]; !ok && !slices.Contains(moduleMetaArgs, arg) {
				problems = append(problems, Problem{CheckNameWiring, call.file, call.line[arg], fmt.Sprintf("module %q passes %q, which %s does not declare", name, arg, mc.Source)})
			}
		}
	}
	return problems, nil
}

type moduleCall struct {
	file string
	args map[string]bool
	line map[string]int
}

// moduleCallArgs returns the argument names of every module block in dir.
func moduleCallArgs(dir string) (map[string]moduleCall, error) {
	bodies, err := parseDir(dir)
	if err != nil {
		return nil, err
	}
	calls := map[string]moduleCall{}
	for _, fb := range bodies {
		for _, b := range fb.body.Blocks {
			if b.Type != "module" || len(b.Labels) != 1 {
				continue
			}
			c := moduleCall{file: fb.file, args: map[string]bool{}, line: map[string]int{}}
			for name, attr := range b.Body.Attributes {
				c.args[name] = true
				c.line[name] = attr.SrcRange.Start.Line
			}
			calls[b.Labels[0]] = c
		}
	}
	return calls, nil
}

type fileBody struct {
	file string
	body *hclsyntax.Body
}

// parseDir parses every .tf file of dir with the HCL native syntax parser.
// A file that does not parse is an error: CheckVariables reports it with
// its position, so callers run that check first.
func parseDir(dir string) ([]fileBody, error) {
	files, err := tfFiles(dir)
	if err != nil {
		return nil, err
	}
	p := hclparse.NewParser()
	var out []fileBody
	for _, f := range files {
		hf, diags := p.ParseHCLFile(f)
		if diags.HasErrors() {
			return nil, fmt.Errorf("terraform: parse %s: %w", f, diags)
		}
		out = append(out, fileBody{file: f, body: hf.Body.(*hclsyntax.Body)})
	}
	return out, nil
}

// CheckReadme reports every input and output of the module in dir that its
// README.md does not mention as `name` (in backquotes), and a missing
// README.md.
func CheckReadme(dir string) ([]Problem, error) {
	mod, _, err := loadModule(dir)
	if err != nil {
		return nil, err
	}
	readme := filepath.Join(dir, "README.md")
	text, err := os.ReadFile(readme)
	if errors.Is(err, os.ErrNotExist) {
		return []Problem{{CheckNameReadme, readme, 0, "missing: a module's README lists its inputs and outputs"}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("terraform: read %s: %w", readme, err)
	}
	var problems []Problem
	for _, name := range sortedKeys(mod.Variables) {
		if !bytes.Contains(text, []byte("`"+name+"`")) {
			problems = append(problems, Problem{CheckNameReadme, readme, 0, fmt.Sprintf("input %q is not listed", name)})
		}
	}
	for _, name := range sortedKeys(mod.Outputs) {
		if !bytes.Contains(text, []byte("`"+name+"`")) {
			problems = append(problems, Problem{CheckNameReadme, readme, 0, fmt.Sprintf("output %q is not listed", name)})
		}
	}
	return problems, nil
}

// Setting is one QUOTIENT_* environment variable a module passes to the
// coordinator.
type Setting struct {
	Name string // e.g. QUOTIENT_REGION
	File string
	Line int
}

var settingName = regexp.MustCompile(`^QUOTIENT_[A-Z0-9_]+$`)

// CoordinatorEnv returns the QUOTIENT_* names that the .tf files of dir
// contain as string literals or object keys (e.g. in
// `locals { coordinator_env = { QUOTIENT_REGION = var.region } }`), in
// file and line order. A name built at plan time ("QUOTIENT_${x}") is not
// seen; the modules do not do that.
func CoordinatorEnv(dir string) ([]Setting, error) {
	bodies, err := parseDir(dir)
	if err != nil {
		return nil, err
	}
	var out []Setting
	for _, fb := range bodies {
		hclsyntax.VisitAll(fb.body, func(n hclsyntax.Node) hcl.Diagnostics {
			var name string
			switch e := n.(type) {
			case *hclsyntax.ObjectConsKeyExpr:
				if !e.ForceNonLiteral {
					name = hcl.ExprAsKeyword(e.Wrapped)
				}
			case *hclsyntax.LiteralValueExpr:
				if e.Val.Type() == cty.String && e.Val.IsKnown() && !e.Val.IsNull() {
					name = e.Val.AsString()
				}
			}
			if settingName.MatchString(name) {
				out = append(out, Setting{Name: name, File: fb.file, Line: n.Range().Start.Line})
			}
			return nil
		})
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].File != out[j].File {
			return out[i].File < out[j].File
		}
		return out[i].Line < out[j].Line
	})
	return out, nil
}

// CheckCoordinatorEnv reports every QUOTIENT_* setting in the .tf files of
// dir that known does not accept (a setting `quotient coordinator` would
// ignore), and every name in required that no file sets. dir is a module
// that runs the coordinator, such as modules/region.
func CheckCoordinatorEnv(dir string, known func(name string) bool, required []string) ([]Problem, error) {
	settings, err := CoordinatorEnv(dir)
	if err != nil {
		return nil, err
	}
	var problems []Problem
	seen := map[string]bool{}
	for _, s := range settings {
		seen[s.Name] = true
		if !known(s.Name) {
			problems = append(problems, Problem{CheckNameCoordinator, s.File, s.Line, fmt.Sprintf("%s is not a setting of quotient coordinator (no such flag)", s.Name)})
		}
	}
	for _, r := range required {
		if !seen[r] {
			problems = append(problems, Problem{CheckNameCoordinator, dir, 0, fmt.Sprintf("required setting %s is not passed to the coordinator", r)})
		}
	}
	return problems, nil
}

// Dirs returns the module directories under root: every directory below
// root/modules and root/examples that holds a .tf file, sorted.
func Dirs(root string) ([]string, error) {
	var dirs []string
	for _, sub := range []string{"modules", "examples"} {
		err := filepath.WalkDir(filepath.Join(root, sub), func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == ".terraform" || (strings.HasPrefix(d.Name(), ".") && path != filepath.Join(root, sub))) {
				return filepath.SkipDir
			}
			if d.IsDir() {
				if files, _ := filepath.Glob(filepath.Join(path, "*.tf")); len(files) > 0 {
					dirs = append(dirs, path)
				}
			}
			return nil
		})
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("terraform: walk %s: %w", root, err)
		}
	}
	sort.Strings(dirs)
	return dirs, nil
}

// CheckTree runs every directory check on every module directory under
// root (see Dirs): variables, format and wiring everywhere, README for the
// reusable modules under root/modules. It does not run CheckCoordinatorEnv,
// whose known settings only the caller has.
func CheckTree(root string) ([]Problem, error) {
	dirs, err := Dirs(root)
	if err != nil {
		return nil, err
	}
	if len(dirs) == 0 {
		return nil, fmt.Errorf("%w: no module under %s", ErrNotModule, root)
	}
	var problems []Problem
	for _, dir := range dirs {
		var dirProblems []Problem
		checks := []func(string) ([]Problem, error){CheckVariables, CheckFormat}
		if rel, _ := filepath.Rel(root, dir); strings.HasPrefix(rel, "modules"+string(filepath.Separator)) {
			checks = append(checks, CheckReadme)
		}
		for _, check := range checks {
			p, err := check(dir)
			if err != nil {
				return nil, err
			}
			dirProblems = append(dirProblems, p...)
		}
		problems = append(problems, dirProblems...)
		if hasSyntaxProblem(dirProblems) {
			continue // wiring needs files that parse
		}
		p, err := CheckWiring(dir)
		if err != nil {
			return nil, err
		}
		problems = append(problems, p...)
	}
	return problems, nil
}

func hasSyntaxProblem(ps []Problem) bool {
	return slices.ContainsFunc(ps, func(p Problem) bool { return p.Check == CheckNameSyntax })
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
