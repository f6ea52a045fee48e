package rls

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// DefaultAppDirectory is the subdirectory of a runtime directory that holds
// the configuration files, envoyproxy's RUNTIME_APPDIRECTORY default.
const DefaultAppDirectory = "config"

// LoadDir parses every YAML file (*.yaml, *.yml) under dir and its
// subdirectories, in lexical order of their paths, skipping files and
// directories whose names start with '.' (editors' swap files; a
// Kubernetes config map's "..data" directory is reached through the
// file links beside it). dir and the files may be symbolic links. dir is envoyproxy's
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY. Errors name the
// file; a directory without YAML files is an error (nothing to serve).
func LoadDir(dir string, opts ParseOptions) (*Config, error) {
	files, _, err := readDir(dir)
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%w: %s: no *.yaml or *.yml file", ErrInvalidConfig, dir)
	}
	return Parse(files, opts)
}

// fileStamp identifies one version of a file cheaply.
type fileStamp struct {
	path string
	size int64
	mod  time.Time
}

// readDir reads the YAML files under dir with their stamps. dir may be a
// symbolic link (it is resolved on every read, so swapping the link is a
// change), and so may the files (a Kubernetes config map mounts each file
// as a link into its "..data" directory, which is swapped on update).
func readDir(dir string) ([]File, []fileStamp, error) {
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("rls: config directory: %w", err)
	}
	var paths []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path != root && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		if ext := filepath.Ext(path); ext == ".yaml" || ext == ".yml" {
			paths = append(paths, path)
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("rls: config directory: %w", err)
	}
	sort.Strings(paths)
	files := make([]File, 0, len(paths))
	stamps := make([]fileStamp, 0, len(paths))
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, nil, fmt.Errorf("rls: %w", err)
		}
		if st.Size() > MaxFileBytes {
			return nil, nil, &ConfigError{File: rel(root, p), Msg: fmt.Sprintf("file is %d bytes, more than %d", st.Size(), MaxFileBytes)}
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, nil, fmt.Errorf("rls: %w", err)
		}
		files = append(files, File{Name: rel(root, p), Data: data})
		stamps = append(stamps, fileStamp{path: p, size: st.Size(), mod: st.ModTime()})
	}
	return files, stamps, nil
}

func rel(dir, p string) string {
	if r, err := filepath.Rel(dir, p); err == nil {
		return r
	}
	return p
}

func stampsOf(dir string) ([]fileStamp, error) {
	_, stamps, err := readDir(dir)
	return stamps, err
}

func sameStamps(a, b []fileStamp) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].path != b[i].path || a[i].size != b[i].size || !a[i].mod.Equal(b[i].mod) {
			return false
		}
	}
	return true
}

// Watcher reloads a configuration directory when a file under it is
// created, removed or changed (path, size or modification time), and keeps
// the last good configuration when the new one does not parse. Its methods
// are safe for concurrent use; Check blocks while it reads the files.
type Watcher struct {
	dir    string
	opts   ParseOptions
	apply  func(*Config) error
	logger *slog.Logger

	mu      sync.Mutex
	stamps  []fileStamp
	current *Config
	lastErr error
	onCheck func(ok bool) // metrics hook; may be nil
}

// NewWatcher loads dir once and returns a Watcher that calls apply with
// every configuration that loads, starting with this one; a configuration
// that apply refuses (an error: say, it names a policy the server does not
// have) is a failed reload like one that does not parse. It fails when the
// first load fails (there is no last good configuration to keep). logger
// may be nil.
func NewWatcher(dir string, opts ParseOptions, apply func(*Config) error, logger *slog.Logger) (*Watcher, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	files, stamps, err := readDir(dir)
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%w: %s: no *.yaml or *.yml file", ErrInvalidConfig, dir)
	}
	cfg, err := Parse(files, opts)
	if err != nil {
		return nil, err
	}
	if err := apply(cfg); err != nil {
		return nil, err
	}
	return &Watcher{dir: dir, opts: opts, apply: apply, logger: logger, stamps: stamps, current: cfg}, nil
}

// OnCheck sets a hook called after every reload attempt with its result
// (for metrics). Set it before Run.
func (w *Watcher) OnCheck(f func(ok bool)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.onCheck = f
}

// Current is the configuration in force.
func (w *Watcher) Current() *Config {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.current
}

// LastError is the error of the latest reload attempt, nil when it
// succeeded (or none was needed).
func (w *Watcher) LastError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastErr
}

// Check reloads once if the directory changed. It reports whether a new
// configuration was applied; on a parse error the configuration in force
// stays, the error is logged and returned by LastError, and the same
// broken files are not parsed again until they change.
func (w *Watcher) Check() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	stamps, err := stampsOf(w.dir)
	if err == nil && sameStamps(stamps, w.stamps) {
		return false
	}
	var cfg *Config
	if err == nil {
		var files []File
		files, stamps, err = readDir(w.dir)
		switch {
		case err != nil:
		case len(files) == 0:
			err = fmt.Errorf("%w: %s: no *.yaml or *.yml file", ErrInvalidConfig, w.dir)
		default:
			if cfg, err = Parse(files, w.opts); err == nil {
				err = w.apply(cfg)
			}
		}
	}
	if err != nil {
		w.stamps = stamps
		w.lastErr = err
		w.logger.Error("rls: configuration reload failed; keeping the last good configuration", "dir", w.dir, "err", err)
		if w.onCheck != nil {
			w.onCheck(false)
		}
		return false
	}
	w.stamps, w.current, w.lastErr = stamps, cfg, nil
	w.logger.Info("rls: configuration reloaded", "dir", w.dir, "files", len(cfg.files), "domains", len(cfg.domains), "rules", cfg.rules)
	if w.onCheck != nil {
		w.onCheck(true)
	}
	return true
}

// Run calls Check every interval until ctx ends.
func (w *Watcher) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.Check()
		}
	}
}
