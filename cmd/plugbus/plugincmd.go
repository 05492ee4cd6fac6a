package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/plugbus/plugbus/plugin"
)

const pluginUsage = `usage: plugbus plugin <command> [arguments]

commands:
  lock <manifest>     compute the SHA-256 of every plugin the manifest lists and write it into the manifest
  verify <binary>     print a plugin binary's checksum, protocol version, name, version and stages
                      (runs the binary, pinned to the checksum it prints)
`

// runPlugin runs `plugbus plugin ...`.
func runPlugin(_ context.Context, w io.Writer, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(w, pluginUsage)
		return errors.New("plugin: missing command")
	}
	switch args[0] {
	case "lock":
		if len(args) != 2 {
			return errors.New("plugin lock: want exactly one manifest path: plugbus plugin lock <manifest>")
		}
		m, err := plugin.LockManifest(args[1])
		if err != nil {
			return err
		}
		for _, e := range m.Plugins {
			fmt.Fprintf(w, "%s  %s\n", e.SHA256, e.Path)
		}
		fmt.Fprintf(w, "locked %d plugin(s) in %s\n", len(m.Plugins), args[1])
		return nil
	case "verify":
		if len(args) != 2 {
			return errors.New("plugin verify: want exactly one binary path: plugbus plugin verify <binary>")
		}
		return verify(w, args[1])
	case "help", "-h", "--help":
		fmt.Fprint(w, pluginUsage)
		return nil
	}
	fmt.Fprint(w, pluginUsage)
	return fmt.Errorf("plugin: unknown command %q", args[0])
}

func verify(w io.Writer, path string) error {
	sum, err := plugin.SHA256File(path)
	if err != nil {
		return err
	}
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p, err := plugin.Load(path, plugin.WithSHA256(sum), plugin.WithLogger(quiet))
	if err != nil {
		return fmt.Errorf("plugin verify: %s is not a loadable plugbus plugin: %w", path, err)
	}
	defer p.Close()
	d := p.Describe()
	fmt.Fprintf(w, "path:             %s\n", d.Path)
	fmt.Fprintf(w, "sha256:           %s\n", d.SHA256)
	fmt.Fprintf(w, "protocol version: %d\n", d.ProtocolVersion)
	fmt.Fprintf(w, "name:             %s\n", d.Name)
	fmt.Fprintf(w, "version:          %s\n", d.Version)
	fmt.Fprintf(w, "sdk:              %s\n", d.SDK)
	fmt.Fprintf(w, "stages:           %s\n", d.Stages)
	if len(d.Errors) > 0 {
		fmt.Fprintf(w, "errors:           %s\n", strings.Join(d.Errors, "; "))
	}
	return nil
}
