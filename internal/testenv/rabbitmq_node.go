package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// RabbitNode is a RabbitMQ node that one test started for itself, for
// tests that stop, restart or break a broker: it has its own node name,
// AMQP, distribution and epmd ports, data and log directories under the
// test's temporary directory, listens on 127.0.0.1 only and runs no
// plugins. Nothing it does reaches the shared test broker.
type RabbitNode struct {
	// Name is the Erlang node name (what rabbitmqctl -n takes).
	Name string
	// URL is the node's AMQP URL, as user guest.
	URL string

	dir    string
	env    []string // of the node and of rabbitmqctl
	ctl    string   // rabbitmqctl
	server *process
	epmd   *process
}

// process is a started command and a channel closed once it exited.
type process struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

func startProcess(cmd *exec.Cmd) (*process, error) {
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

func (p *process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends sig and waits up to grace for the process to exit, then
// kills it and waits for that.
func (p *process) stop(sig os.Signal, grace time.Duration) error {
	if !p.running() {
		return nil
	}
	_ = p.cmd.Process.Signal(sig)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.exited:
		return nil
	case <-t.C:
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
	return fmt.Errorf("%s did not exit within %v of %v: killed", filepath.Base(p.cmd.Path), grace, sig)
}

// rabbitmqNodeHowTo says what a machine without RabbitMQ needs.
const rabbitmqNodeHowTo = "install RabbitMQ (apt-get install rabbitmq-server, brew install rabbitmq), " +
	"or set PLUGBUS_RABBITMQ_SERVER to its sbin/rabbitmq-server script (not a wrapper that switches user)"

// StartRabbitMQNode starts a RabbitMQ node of t's own (see [RabbitNode])
// and returns its AMQP URL once it accepts connections. The node and its
// epmd are stopped (killed if they do not stop) and their directories
// removed when t ends, whether it passed or failed; on Linux they are
// killed too if the test process dies. Without RabbitMQ installed t is
// skipped with how to install it, except under CI=true, where it fails.
//
// The node takes a few seconds to start: use it for the tests that need
// a broker of their own, and the shared one ([RabbitMQ]) otherwise.
func StartRabbitMQNode(t testing.TB) (string, *RabbitNode) {
	t.Helper()
	server, ctl, epmd, err := rabbitmqCommands()
	if err != nil {
		msg := "starting a RabbitMQ node of the test's own: " + err.Error() + "; " + rabbitmqNodeHowTo
		if CI() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	ports, err := freePorts(3)
	if err != nil {
		t.Fatalf("choosing ports for a RabbitMQ node: %v", err)
	}
	amqpPort, distPort, epmdPort := ports[0], ports[1], ports[2]
	n := &RabbitNode{Name: "plugbus-test-" + randomHex(4) + "@localhost", dir: t.TempDir(), ctl: ctl}
	n.URL = "amqp://guest:guest@127.0.0.1:" + strconv.Itoa(amqpPort) + "/"
	if err := n.writeFiles(amqpPort); err != nil {
		t.Fatalf("preparing the RabbitMQ node's directory: %v", err)
	}
	n.env = append(cleanEnv(),
		"HOME="+n.path("home"), // its Erlang cookie, shared with rabbitmqctl
		"RABBITMQ_NODENAME="+n.Name,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(amqpPort),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(distPort),
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"ERL_EPMD_PORT="+strconv.Itoa(epmdPort),
		"RABBITMQ_CONF_ENV_FILE="+n.path("rabbitmq-env.conf"), // not the system's
		"RABBITMQ_CONFIG_FILE="+n.path("rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+n.path("advanced.config"), // absent
		"RABBITMQ_ENABLED_PLUGINS_FILE="+n.path("enabled_plugins"), // none: no management plugin
		"RABBITMQ_PLUGINS_EXPAND_DIR="+n.path("plugins-expand"),
		"RABBITMQ_MNESIA_BASE="+n.path("data"),
		"RABBITMQ_LOG_BASE="+n.path("log"),
		"RABBITMQ_PID_FILE="+n.path("node.pid"),
		// rabbitmq-server then execs the Erlang VM rather than running it
		// under a shell that forwards signals: the node is this process's
		// child, which SIGTERM stops gracefully and Linux kills with the
		// test process (the shell would die alone, the node live on).
		"RUNNING_UNDER_SYSTEMD=true",
	)
	// An epmd of the node's own, started before the node so that the node
	// does not start one (a daemon, which would outlive the test).
	n.epmd, err = n.run(epmd, "epmd.out", "-port", strconv.Itoa(epmdPort), "-address", "127.0.0.1")
	if err != nil {
		t.Fatalf("starting epmd: %v", err)
	}
	t.Cleanup(func() {
		if err := n.epmd.stop(syscall.SIGTERM, 5*time.Second); err != nil {
			t.Error(err)
		}
	})
	if err := awaitPort(n.epmd, epmdPort, 10*time.Second); err != nil {
		t.Fatalf("epmd of the RabbitMQ node: %v\n%s", err, n.tail("epmd.out"))
	}
	began := time.Now()
	n.server, err = n.run(server, "server.out")
	if err != nil {
		t.Fatalf("starting rabbitmq-server: %v", err)
	}
	t.Cleanup(func() {
		// SIGTERM stops a node gracefully; one that hangs is killed.
		if err := n.server.stop(syscall.SIGTERM, 30*time.Second); err != nil {
			t.Errorf("stopping RabbitMQ node %s: %v", n.Name, err)
		}
	})
	if err := awaitPort(n.server, amqpPort, 2*time.Minute); err != nil {
		t.Fatalf("RabbitMQ node %s did not start: %v\n%s\n%s", n.Name, err, n.tail("server.out"), n.tail(filepath.Join("log", n.Name+".log")))
	}
	t.Logf("RabbitMQ node %s started in %v at %s", n.Name, time.Since(began).Round(time.Millisecond), n.URL)
	return n.URL, n
}

// Ctl runs rabbitmqctl against the node (rabbitmqctl -n Name args...),
// for example Ctl(ctx, "stop_app") and Ctl(ctx, "start_app") to restart
// the broker inside it. The error carries the command's output.
func (n *RabbitNode) Ctl(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, n.ctl, append([]string{"-n", n.Name}, args...)...)
	cmd.Env = n.env
	cmd.Dir = n.dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("rabbitmqctl -n %s %s: %w\n%s", n.Name, strings.Join(args, " "), err, out)
	}
	return nil
}

func (n *RabbitNode) path(name string) string { return filepath.Join(n.dir, name) }

func (n *RabbitNode) writeFiles(amqpPort int) error {
	for _, d := range []string{"home", "data", "log", "plugins-expand"} {
		if err := os.MkdirAll(n.path(d), 0o700); err != nil {
			return err
		}
	}
	files := []struct {
		name, text string
		mode       os.FileMode
	}{
		{"home/.erlang.cookie", randomHex(20), 0o400},
		{"rabbitmq-env.conf", "", 0o600},
		{"enabled_plugins", "[].\n", 0o600},
		{"rabbitmq.conf", "listeners.tcp.default = 127.0.0.1:" + strconv.Itoa(amqpPort) + "\n", 0o600},
	}
	for _, f := range files {
		if err := os.WriteFile(n.path(f.name), []byte(f.text), f.mode); err != nil {
			return err
		}
	}
	return nil
}

// run starts the program with the node's environment, its output in the
// file out of the node's directory.
func (n *RabbitNode) run(program, out string, args ...string) (*process, error) {
	f, err := os.Create(n.path(out))
	if err != nil {
		return nil, err
	}
	defer f.Close() // the child has its own descriptor
	cmd := exec.Command(program, args...)
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = n.env, n.dir, f, f
	return startProcess(cmd)
}

// tail returns the end of a file of the node's directory, for a failure message.
func (n *RabbitNode) tail(name string) string {
	b, err := os.ReadFile(n.path(name))
	if err != nil {
		return name + ": " + err.Error()
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return name + ":\n" + string(bytes.TrimSpace(b))
}

// rabbitmqCommands finds rabbitmq-server, the rabbitmqctl beside it, and
// epmd.
func rabbitmqCommands() (server, ctl, epmd string, err error) {
	if runtime.GOOS == "windows" {
		return "", "", "", errors.New("the node is started with RabbitMQ's Unix scripts")
	}
	var candidates []string
	if p := os.Getenv("PLUGBUS_RABBITMQ_SERVER"); p != "" {
		candidates = []string{p}
	} else {
		// Debian and Ubuntu put the real script here; the rabbitmq-server
		// on PATH switches to the rabbitmq user and its directories.
		candidates = []string{"/usr/lib/rabbitmq/bin/rabbitmq-server"}
		if p, err := exec.LookPath("rabbitmq-server"); err == nil {
			candidates = append(candidates, p)
		}
	}
	for _, c := range candidates {
		real, err := filepath.EvalSymlinks(c)
		if err != nil {
			continue
		}
		ctl = filepath.Join(filepath.Dir(real), "rabbitmqctl")
		if _, err := os.Stat(ctl); err == nil {
			server = real
			break
		}
	}
	if server == "" {
		return "", "", "", fmt.Errorf("no rabbitmq-server script with a rabbitmqctl beside it (looked at %s)", strings.Join(candidates, ", "))
	}
	if epmd, err = exec.LookPath("epmd"); err != nil {
		erl, lerr := exec.LookPath("erl")
		if lerr != nil {
			return "", "", "", errors.New("no epmd or erl on PATH: Erlang is not installed")
		}
		if erl, lerr = filepath.EvalSymlinks(erl); lerr != nil {
			return "", "", "", lerr
		}
		epmd = filepath.Join(filepath.Dir(erl), "epmd")
		if _, err := os.Stat(epmd); err != nil {
			return "", "", "", fmt.Errorf("no epmd on PATH nor beside %s", erl)
		}
	}
	return server, ctl, epmd, nil
}

// cleanEnv is the test's environment without what configures RabbitMQ or
// Erlang (a system rabbitmq-env.conf, ERL_FLAGS, another node's epmd port).
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "RABBITMQ_") || strings.HasPrefix(kv, "ERL_") || strings.HasPrefix(kv, "HOME=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// freePorts returns n distinct TCP ports free on 127.0.0.1.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close() // held until all are chosen: no port twice
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// awaitPort waits until port accepts connections on 127.0.0.1, p exits
// or limit passes. A starting program gives no other sign of being ready.
func awaitPort(p *process, port int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nothing accepts connections on %s after %v: %w", addr, limit, err)
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited (%v) before accepting connections on %s", filepath.Base(p.cmd.Path), p.cmd.ProcessState, addr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
