package sidecar_test

// The tests run against a real sidecar process: `python -m sidecar serve` (python from PATH,
// the project's venv in ./dev.sh test) on a free loopback port, storing in a temporary
// directory, with two tenants configured so that every call goes through the bearer token.

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	sidecar "github.com/context-sidecar/context-sidecar/clients/go"
	pb "github.com/context-sidecar/context-sidecar/clients/go/contextsidecarv1"
)

// The tenants' tokens; the sidecar's config holds only their SHA-256.
var tokens = map[string]string{"alpha": "go-client-token-alpha", "beta": "go-client-token-beta"}

// target is the address the sidecar said it serves on.
var target string

const readyTimeout = 60 * time.Second

func TestMain(m *testing.M) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sidecar tests:", err)
		code = 1
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	dir, err := os.MkdirTemp("", "cs-go-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	config := filepath.Join(dir, "sidecar.toml")
	var toml strings.Builder
	for id, token := range tokens {
		fmt.Fprintf(&toml, "[[auth.tenants]]\nid = %q\ntoken_sha256 = \"%x\"\n\n", id, sha256.Sum256([]byte(token)))
	}
	if err := os.WriteFile(config, []byte(toml.String()), 0o600); err != nil {
		return 0, err
	}
	stop, addr, err := startSidecar(filepath.Join(dir, "data"), "--config", config)
	if err != nil {
		return 0, err
	}
	defer stop()
	defer func() { stopTLSSidecars() }() // the TLS tests' sidecars, if they started
	target = addr
	// Example reads where the sidecar is, and its token, from the environment, as a host would.
	if err := os.Setenv("SIDECAR_ADDRESS", addr); err != nil {
		return 0, err
	}
	if err := os.Setenv("SIDECAR_TOKEN", tokens["alpha"]); err != nil {
		return 0, err
	}
	return m.Run(), nil
}

var servingLine = regexp.MustCompile(`^context-sidecar serving on (\S+)$`)

// startSidecar runs the sidecar from the repository root (so `-m sidecar` resolves without an
// installed package) and returns once it says where it serves; stop kills it and waits.
func startSidecar(storage string, flags ...string) (stop func(), addr string, err error) {
	args := append([]string{"-m", "sidecar", "serve", "--listen", "127.0.0.1:0", "--storage-path", storage,
		"--log-level", "WARNING"}, flags...)
	cmd := exec.Command("python", args...)
	cmd.Dir = filepath.Join("..", "..")
	cmd.SysProcAttr = orphanGuard()
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("cannot start the sidecar with the python on PATH: %w", err)
	}
	stop = func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	ready := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			if match := servingLine.FindStringSubmatch(strings.TrimSpace(lines.Text())); match != nil {
				ready <- match[1]
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout) // keep reading, so the sidecar never blocks on a full pipe
		close(ready)
	}()
	select {
	case addr, ok := <-ready:
		if ok {
			return stop, addr, nil
		}
		stop()
		return nil, "", fmt.Errorf("the sidecar exited before serving; stderr:\n%s", stderr.String())
	case <-time.After(readyTimeout):
		stop()
		return nil, "", fmt.Errorf("the sidecar was not serving after %s; stderr:\n%s", readyTimeout, stderr.String())
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// dial connects as a tenant ("" for no token), closed when the test ends.
func dial(t *testing.T, tenant string) *sidecar.Client {
	t.Helper()
	var opts []sidecar.Option
	if tenant != "" {
		opts = append(opts, sidecar.WithToken(tokens[tenant]))
	}
	c, err := sidecar.Dial(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// recount counts texts with CountTokens: the independent count every reported one must equal.
func recount(t *testing.T, c *sidecar.Client, counter string, texts []string) []int32 {
	t.Helper()
	if len(texts) == 0 {
		return nil
	}
	resp, err := c.CountTokens(context.Background(), &pb.CountTokensRequest{TokenCounter: counter, Texts: texts})
	if err != nil {
		t.Fatalf("CountTokens: %v", err)
	}
	if len(resp.GetCounts()) != len(texts) {
		t.Fatalf("CountTokens answered %d counts for %d texts", len(resp.GetCounts()), len(texts))
	}
	return resp.GetCounts()
}

// mustError is the decoded error of a call that had to fail.
func mustError(t *testing.T, err error) *sidecar.Error {
	t.Helper()
	if err == nil {
		t.Fatal("the call succeeded; an error was expected")
	}
	e, ok := sidecar.AsError(err)
	if !ok {
		t.Fatalf("not a gRPC status error: %v", err)
	}
	var direct *sidecar.Error
	if !errors.As(err, &direct) {
		t.Fatalf("the client's error is not an *sidecar.Error: %T", err)
	}
	return e
}
