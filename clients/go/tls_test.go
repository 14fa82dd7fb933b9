package sidecar_test

// TLS and mTLS through WithTLS, against two real sidecars serving [server.tls] with certificates
// made for this run (`python -m tests.certificates`): one with TLS, one with mTLS (a client CA
// set), both with the suite's tenants. They start with the first test that needs them, once for
// the suite, and stop after it (TestMain).

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	sidecar "github.com/context-sidecar/context-sidecar/clients/go"
	pb "github.com/context-sidecar/context-sidecar/clients/go/contextsidecarv1"
)

// tlsSidecars are the suite's TLS and mTLS sidecars and the certificates' folder.
type tlsSidecars struct {
	certificates string
	tls, mtls    string // the addresses they serve on
}

func (s tlsSidecars) pem(stem string) string { return filepath.Join(s.certificates, stem+".pem") }
func (s tlsSidecars) key(stem string) string { return filepath.Join(s.certificates, stem+".key") }

var (
	tlsOnce    sync.Once
	tlsStarted tlsSidecars
	tlsErr     error
	// stopTLSSidecars stops them and removes their folder; TestMain calls it after the tests.
	stopTLSSidecars = func() {}
)

// startedTLSSidecars starts the TLS and mTLS sidecars the first time a test asks.
func startedTLSSidecars(t *testing.T) tlsSidecars {
	t.Helper()
	tlsOnce.Do(func() { tlsStarted, tlsErr = startTLSSidecars() })
	if tlsErr != nil {
		t.Fatal(tlsErr)
	}
	return tlsStarted
}

func startTLSSidecars() (started tlsSidecars, err error) {
	dir, err := os.MkdirTemp("", "cs-go-tls-")
	if err != nil {
		return started, err
	}
	var stops []func()
	stopTLSSidecars = func() {
		for _, stop := range stops {
			stop()
		}
		_ = os.RemoveAll(dir)
	}
	started.certificates = filepath.Join(dir, "certificates")
	made := exec.Command("python", "-m", "tests.certificates", started.certificates)
	made.Dir = filepath.Join("..", "..")
	if output, err := made.CombinedOutput(); err != nil {
		return started, fmt.Errorf("python -m tests.certificates: %w\n%s", err, output)
	}
	config := filepath.Join(dir, "sidecar.toml")
	var toml strings.Builder
	for id, token := range tokens {
		fmt.Fprintf(&toml, "[[auth.tenants]]\nid = %q\ntoken_sha256 = \"%x\"\n\n", id, sha256.Sum256([]byte(token)))
	}
	if err := os.WriteFile(config, []byte(toml.String()), 0o600); err != nil {
		return started, err
	}
	flags := []string{"--config", config, "--tls-cert-file", started.pem("server"), "--tls-key-file", started.key("server")}
	// Started one after the other: the machine's cores go to one Python start at a time.
	stop, addr, err := startSidecar(filepath.Join(dir, "tls"), flags...)
	if err != nil {
		return started, err
	}
	stops, started.tls = append(stops, stop), addr
	stop, addr, err = startSidecar(filepath.Join(dir, "mtls"), append(flags, "--tls-client-ca-file", started.pem("ca"))...)
	if err != nil {
		return started, err
	}
	stops, started.mtls = append(stops, stop), addr
	return started, nil
}

// dialTLS connects as tenant alpha with files, closed when the test ends.
func dialTLS(t *testing.T, addr string, files sidecar.TLSFiles) *sidecar.Client {
	t.Helper()
	c, err := sidecar.Dial(addr, sidecar.WithToken(tokens["alpha"]), sidecar.WithTLS(files))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// assembleOneTurn opens a run and assembles its first turn: the window holds what was sent.
func assembleOneTurn(t *testing.T, c *sidecar.Client, runID string) {
	t.Helper()
	ctx := context.Background()
	opened, err := c.OpenRun(ctx, &pb.OpenRunRequest{RunId: runID, TokenCounter: proto.String("chars")})
	if err != nil {
		t.Fatalf("OpenRun: %v", err)
	}
	if !opened.GetCreated() {
		t.Fatalf("OpenRun did not create %s", runID)
	}
	content := "a question sent over TLS to " + runID
	turn, err := c.AssembleContext(ctx, &pb.AssembleContextRequest{RunId: runID, Iteration: 1,
		AppendEvents: []*pb.Event{{EventId: "q1", Role: "user", Content: content}}})
	if err != nil {
		t.Fatalf("AssembleContext: %v", err)
	}
	entries := turn.GetEntries()
	if len(entries) != 1 || entries[0].GetEventId() != "q1" || entries[0].GetText() != content {
		t.Fatalf("the window is %v, not the one event sent", entries)
	}
}

// mustBeRefused checks that c's first call is refused before reaching the sidecar: Unavailable,
// with no reason (the sidecar gives one to every error it answers). It returns the message.
func mustBeRefused(t *testing.T, c *sidecar.Client) string {
	t.Helper()
	_, err := c.GetCapabilities(context.Background(), &pb.GetCapabilitiesRequest{})
	e := mustError(t, err)
	if e.Code != codes.Unavailable || e.Reason != "" {
		t.Fatalf("expected Unavailable from the handshake, got %v", e)
	}
	return e.Message
}

func TestTLSAssemblesATurnWithTheCA(t *testing.T) {
	s := startedTLSSidecars(t)
	assembleOneTurn(t, dialTLS(t, s.tls, sidecar.TLSFiles{CAFile: s.pem("ca")}), "over-tls")
	// The token still travels, and is checked, over TLS: without it the sidecar refuses the call.
	anonymous, err := sidecar.Dial(s.tls, sidecar.WithTLS(sidecar.TLSFiles{CAFile: s.pem("ca")}))
	if err != nil {
		t.Fatal(err)
	}
	defer anonymous.Close()
	_, err = anonymous.GetCapabilities(context.Background(), &pb.GetCapabilitiesRequest{})
	if e := mustError(t, err); e.Code != codes.Unauthenticated {
		t.Fatalf("expected Unauthenticated without a token, got %v", e)
	}
}

func TestTLSRefusesAServerAnotherCASigned(t *testing.T) {
	s := startedTLSSidecars(t)
	message := mustBeRefused(t, dialTLS(t, s.tls, sidecar.TLSFiles{CAFile: s.pem("other-ca")}))
	if !strings.Contains(message, "certificate") {
		t.Fatalf("the refusal does not say it was the certificate: %s", message)
	}
}

func TestTLSRefusesAPlaintextClient(t *testing.T) {
	s := startedTLSSidecars(t)
	c, err := sidecar.Dial(s.tls, sidecar.WithToken(tokens["alpha"]))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mustBeRefused(t, c)
}

func TestMTLSAssemblesATurnWithAClientCertificate(t *testing.T) {
	s := startedTLSSidecars(t)
	assembleOneTurn(t, dialTLS(t, s.mtls, sidecar.TLSFiles{CAFile: s.pem("ca"), CertFile: s.pem("client"),
		KeyFile: s.key("client")}), "over-mtls")
}

func TestMTLSRefusesAClientWithoutACertificate(t *testing.T) {
	s := startedTLSSidecars(t)
	mustBeRefused(t, dialTLS(t, s.mtls, sidecar.TLSFiles{CAFile: s.pem("ca")}))
}

func TestMTLSRefusesAClientCertificateAnotherCASigned(t *testing.T) {
	s := startedTLSSidecars(t)
	mustBeRefused(t, dialTLS(t, s.mtls, sidecar.TLSFiles{CAFile: s.pem("ca"), CertFile: s.pem("other-client"),
		KeyFile: s.key("other-client")}))
}

func TestDialRefusesTLSFilesItCannotUse(t *testing.T) {
	s := startedTLSSidecars(t)
	absent := filepath.Join(s.certificates, "absent.pem")
	for _, tc := range []struct {
		name  string
		files sidecar.TLSFiles
		says  []string
	}{
		{"a certificate without its key", sidecar.TLSFiles{CAFile: s.pem("ca"), CertFile: s.pem("client")},
			[]string{"CertFile and KeyFile go together"}},
		{"a key without its certificate", sidecar.TLSFiles{CAFile: s.pem("ca"), KeyFile: s.key("client")},
			[]string{"CertFile and KeyFile go together"}},
		{"a certificate with another one's key",
			sidecar.TLSFiles{CAFile: s.pem("ca"), CertFile: s.pem("client"), KeyFile: s.key("other-client")},
			[]string{s.pem("client"), s.key("other-client"), "private key does not match"}},
		{"an unreadable CA file", sidecar.TLSFiles{CAFile: absent}, []string{"CAFile", absent, "no such file"}},
		{"an unreadable key file", sidecar.TLSFiles{CAFile: s.pem("ca"), CertFile: s.pem("client"), KeyFile: absent},
			[]string{absent, "no such file"}},
		{"a CA file holding no certificate", sidecar.TLSFiles{CAFile: s.key("client")},
			[]string{"CAFile", s.key("client"), "holds no PEM certificate"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := sidecar.Dial(s.mtls, sidecar.WithTLS(tc.files))
			if err == nil {
				_ = c.Close()
				t.Fatal("Dial succeeded")
			}
			for _, part := range tc.says {
				if !strings.Contains(err.Error(), part) {
					t.Errorf("the error does not say %q: %v", part, err)
				}
			}
		})
	}
}
