package quotientv1_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/quotientlabs/quotient"

// TestGeneratedCodeIsFresh regenerates the Go code from the .proto files into
// a temporary directory, exactly as `make proto` does, and compares it with
// the committed files.
func TestGeneratedCodeIsFresh(t *testing.T) {
	protoc, err := exec.LookPath("protoc")
	if err != nil {
		t.Skip("protoc not found: install it (apt-get install -y protobuf-compiler) to check the generated code")
	}
	if _, err := exec.LookPath("protoc-gen-go"); err != nil {
		t.Skip("protoc-gen-go not found on PATH: go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12")
	}

	protoRoot, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	var protos []string
	require.NoError(t, filepath.WalkDir(protoRoot, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".proto") {
			rel, relErr := filepath.Rel(protoRoot, path)
			protos = append(protos, rel)
			return relErr
		}
		return err
	}))
	sort.Strings(protos)
	require.NotEmpty(t, protos, "no .proto files under %s", protoRoot)

	out := t.TempDir()
	args := append([]string{"--proto_path=.", "--go_out=" + out, "--go_opt=module=" + module}, protos...)
	cmd := exec.Command(protoc, args...)
	cmd.Dir = protoRoot
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Run(), "protoc failed: %s", stderr.String())

	generated := map[string]bool{}
	require.NoError(t, filepath.WalkDir(filepath.Join(out, "proto"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(out, path)
		if err != nil {
			return err
		}
		generated[rel] = true
		want, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		got, err := os.ReadFile(filepath.Join(protoRoot, "..", rel))
		require.NoError(t, err, "%s is not committed: run make proto", rel)
		if diff := firstDifference(normalize(want), normalize(got)); diff != "" {
			t.Errorf("%s is stale (run make proto): %s", rel, diff)
		}
		return nil
	}))
	require.NotEmpty(t, generated, "protoc generated nothing")

	// A committed .pb.go without a .proto would be stale too.
	committed, err := filepath.Glob(filepath.Join(protoRoot, "*", "*", "*.pb.go"))
	require.NoError(t, err)
	for _, path := range committed {
		rel, err := filepath.Rel(filepath.Join(protoRoot, ".."), path)
		require.NoError(t, err)
		require.True(t, generated[rel], "%s has no .proto source: delete it or run make proto", rel)
	}
}

// protocVersion matches the header line naming the protoc version, which
// differs between machines without changing the generated code.
var protocVersion = regexp.MustCompile(`(?m)^// \tprotoc +v.*$`)

func normalize(b []byte) string {
	return protocVersion.ReplaceAllString(string(b), "// \tprotoc (any version)")
}

// firstDifference describes the first line where want and got differ, or
// returns "" when they are equal.
func firstDifference(want, got string) string {
	if want == got {
		return ""
	}
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return fmt.Sprintf("line %d: generated %q, committed %q", i+1, wl, gl)
		}
	}
	return "files differ"
}
