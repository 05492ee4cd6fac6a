package plugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// Manifest lists the external plugins a service loads at startup. It is
// JSON:
//
//	{
//	  "plugins": [
//	    {
//	      "path": "bin/tenancy-plugin",
//	      "sha256": "9f86d0…",
//	      "config": {"tenant": "acme"},
//	      "failure_policy": "fail-closed",
//	      "invocation_timeout": "2s"
//	    }
//	  ]
//	}
//
// Relative paths are relative to the manifest's directory. Plugins are
// registered in manifest order: the first is the outermost layer.
type Manifest struct {
	Plugins []ManifestEntry `json:"plugins"`
}

// ManifestEntry is one plugin of a [Manifest].
type ManifestEntry struct {
	// Path is the plugin binary. Required.
	Path string `json:"path"`
	// SHA256 is the binary's checksum (hex). Required; `plugbus plugin
	// lock <manifest>` writes it.
	SHA256 string `json:"sha256,omitempty"`
	// Config is passed to the plugin (sdk.Configurer).
	Config json.RawMessage `json:"config,omitempty"`
	// FailurePolicy is "fail-closed" (default) or "fail-open".
	FailurePolicy string `json:"failure_policy,omitempty"`
	// InvocationTimeout and StartTimeout are Go durations ("2s").
	InvocationTimeout string `json:"invocation_timeout,omitempty"`
	StartTimeout      string `json:"start_timeout,omitempty"`
}

// ManifestError reports an invalid manifest entry.
type ManifestError struct {
	Manifest string
	Index    int // entry index, -1 for the file itself
	Err      error
}

// Error implements error.
// The cause's own "plugin: " prefix is dropped: the message has one.
func (e *ManifestError) Error() string {
	cause := strings.TrimPrefix(fmt.Sprint(e.Err), "plugin: ")
	if e.Index < 0 {
		return fmt.Sprintf("plugin: manifest %s: %s", e.Manifest, cause)
	}
	return fmt.Sprintf("plugin: manifest %s: plugins[%d]: %s", e.Manifest, e.Index, cause)
}

// Unwrap returns the cause.
func (e *ManifestError) Unwrap() error { return e.Err }

// ReadManifest reads and validates the manifest at path (a checksum may be
// missing; [LoadManifest] refuses that).
func ReadManifest(path string) (*Manifest, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, &ManifestError{Manifest: path, Index: -1, Err: err}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, &ManifestError{Manifest: path, Index: -1, Err: fmt.Errorf("not a valid manifest: %w", err)}
	}
	for i, e := range m.Plugins {
		if e.Path == "" {
			return nil, &ManifestError{Manifest: path, Index: i, Err: errors.New("path is empty")}
		}
		if _, err := e.options(); err != nil {
			return nil, &ManifestError{Manifest: path, Index: i, Err: err}
		}
	}
	return &m, nil
}

// resolve returns the entry's binary path relative to the manifest at mpath.
func (e ManifestEntry) resolve(mpath string) string {
	if filepath.IsAbs(e.Path) {
		return e.Path
	}
	return filepath.Join(filepath.Dir(mpath), e.Path)
}

func (e ManifestEntry) options() ([]Option, error) {
	var opts []Option
	if e.SHA256 != "" {
		opts = append(opts, WithSHA256(e.SHA256))
	}
	if len(e.Config) > 0 {
		opts = append(opts, WithConfig(e.Config))
	}
	pol, err := ParseFailurePolicy(e.FailurePolicy)
	if err != nil {
		return nil, err
	}
	opts = append(opts, WithFailurePolicy(pol))
	for _, d := range []struct {
		field, v string
		opt      func(time.Duration) Option
	}{{"invocation_timeout", e.InvocationTimeout, WithInvocationTimeout}, {"start_timeout", e.StartTimeout, WithStartTimeout}} {
		if d.v == "" {
			continue
		}
		dur, err := time.ParseDuration(d.v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w (want a Go duration such as \"2s\")", d.field, err)
		}
		opts = append(opts, d.opt(dur))
	}
	for _, o := range opts { // validate values now
		var c config
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	return opts, nil
}

// Plugins is the set of plugins loaded from a manifest, in manifest order.
type Plugins []*Plugin

// Bus returns the plugins as bus plugins, for bus.WithMiddleware(ps.Bus()...).
func (ps Plugins) Bus() []bus.Plugin {
	out := make([]bus.Plugin, len(ps))
	for i, p := range ps {
		out[i] = p
	}
	return out
}

// Close closes every plugin.
func (ps Plugins) Close() error {
	var errs []error
	for _, p := range ps {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}

// LoadManifest loads every plugin the manifest at path lists, each pinned
// to its checksum; an entry without one is refused. opts apply to every
// plugin, before the entry's own settings. On error, the plugins already
// loaded are closed.
//
//	ps, err := plugin.LoadManifest("plugins.json", plugin.WithLogger(logger))
//	if err != nil { ... }
//	defer ps.Close()
//	b, err := bus.New(bus.WithMiddleware(ps.Bus()...), ...)
func LoadManifest(path string, opts ...Option) (Plugins, error) {
	m, err := ReadManifest(path)
	if err != nil {
		return nil, err
	}
	var ps Plugins
	for i, e := range m.Plugins {
		if e.SHA256 == "" {
			ps.Close()
			return nil, &ManifestError{Manifest: path, Index: i, Err: fmt.Errorf("%s has no sha256; run `plugbus plugin lock %s` after checking the binary", e.Path, path)}
		}
		eo, _ := e.options()
		p, err := Load(e.resolve(path), append(append([]Option(nil), opts...), eo...)...)
		if err != nil {
			ps.Close()
			return nil, &ManifestError{Manifest: path, Index: i, Err: err}
		}
		ps = append(ps, p)
	}
	return ps, nil
}

// LockManifest computes the SHA-256 of every binary the manifest at path
// lists and writes them into the manifest. It returns the entries as
// written. It does not run the binaries.
func LockManifest(path string) (*Manifest, error) {
	m, err := ReadManifest(path)
	if err != nil {
		return nil, err
	}
	for i := range m.Plugins {
		sum, err := SHA256File(m.Plugins[i].resolve(path))
		if err != nil {
			return nil, &ManifestError{Manifest: path, Index: i, Err: err}
		}
		m.Plugins[i].SHA256 = sum
	}
	out, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(out, '\n'), fi.Mode().Perm()); err != nil {
		return nil, fmt.Errorf("plugin: writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("plugin: writing %s: %w", path, err)
	}
	return m, nil
}
