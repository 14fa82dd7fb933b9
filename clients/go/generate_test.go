package sidecar_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The committed contextsidecarv1 is what generate.sh makes of proto/ now: regenerated into a
// temporary directory and compared byte for byte. A changed proto needs ./generate.sh run.
func TestGeneratedCodeIsFresh(t *testing.T) {
	if err := exec.Command("python", "-c", "import grpc_tools.protoc").Run(); err != nil {
		t.Skipf("cannot check the generated code: no python with grpcio-tools on PATH (%v); "+
			"run with the project's venv first on PATH", err)
	}
	out := t.TempDir()
	cmd := exec.Command("./generate.sh", out)
	if output, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("generate.sh: %v\n%s", err, output)
	}
	for _, name := range []string{"sidecar.pb.go", "sidecar_grpc.pb.go"} {
		fresh, err := os.ReadFile(filepath.Join(out, "contextsidecarv1", name))
		if err != nil {
			t.Fatal(err)
		}
		committed, err := os.ReadFile(filepath.Join("contextsidecarv1", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(fresh, committed) {
			t.Errorf("contextsidecarv1/%s is stale: run clients/go/generate.sh (with the venv's python on PATH) "+
				"and commit the result", name)
		}
	}
}
