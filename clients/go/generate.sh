#!/usr/bin/env bash
# Generates contextsidecarv1/ (sidecar.pb.go, sidecar_grpc.pb.go) from the API contract,
# proto/contextsidecar/v1/sidecar.proto, into OUT (an absolute path; default: this directory, the committed
# files; generate_test.go passes a temporary one and compares bytes).
#
# protoc is the one grpcio-tools ships (`python -m grpc_tools.protoc`, python from PATH: the
# project's venv, whose grpcio-tools is pinned), so the "// protoc" header line is reproducible.
# The plugins are this module's tools (the go.mod tool directive pins their versions; go.sum
# checks them), built into bin/ here.
set -euo pipefail
cd "$(dirname "$0")"
out=${1:-.}
bin=$PWD/bin
repo=../..

GOBIN=$bin go install tool
include=$(python -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')
# Only the API proto: -I proto names it by the path its go_package and "source:" line use.
python -m grpc_tools.protoc -I "$repo/proto" -I "$include" \
  --plugin=protoc-gen-go="$bin/protoc-gen-go" --plugin=protoc-gen-go-grpc="$bin/protoc-gen-go-grpc" \
  --go_out="$out" --go_opt=module=github.com/context-sidecar/context-sidecar/clients/go \
  --go-grpc_out="$out" --go-grpc_opt=module=github.com/context-sidecar/context-sidecar/clients/go \
  "$repo/proto/contextsidecar/v1/sidecar.proto"
