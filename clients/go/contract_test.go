package sidecar_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The whole public contract compiles for Go with nothing but -I proto -I third_party: every file
// names a Go import path (the internal storage protos, which did not, live outside proto/).
func TestThePublicContractGeneratesForGo(t *testing.T) {
	protoc, err := exec.LookPath("protoc")
	if err != nil {
		t.Skipf("no protoc on PATH (the project's venv has one: run with it first on PATH): %v", err)
	}
	bin := t.TempDir()
	install := exec.Command("go", "install", "tool")
	install.Env = append(os.Environ(), "GOBIN="+bin)
	if output, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install tool: %v\n%s", err, output)
	}
	var files []string
	for _, root := range []string{"../../proto", "../../third_party"} {
		err := filepath.WalkDir(root, func(path string, entry os.DirEntry, err error) error {
			if err == nil && strings.HasSuffix(path, ".proto") {
				relative, _ := filepath.Rel(root, path)
				files = append(files, relative)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(files) < 3 {
		t.Fatalf("found only %v under proto/ and third_party/", files)
	}
	out := t.TempDir()
	args := append([]string{"-I", "../../proto", "-I", "../../third_party",
		"--plugin=protoc-gen-go=" + filepath.Join(bin, "protoc-gen-go"),
		"--plugin=protoc-gen-go-grpc=" + filepath.Join(bin, "protoc-gen-go-grpc"),
		"--go_out=" + out, "--go-grpc_out=" + out}, files...)
	if output, err := exec.Command(protoc, args...).CombinedOutput(); err != nil {
		t.Fatalf("protoc %s: %v\n%s", strings.Join(args, " "), err, output)
	}
}
