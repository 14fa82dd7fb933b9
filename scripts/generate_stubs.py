"""Regenerate everything committed in sidecar/pb: the Python stubs of the API (proto/) and of the
storage records (sidecar/storage/proto/), and the contract the package ships.

    python scripts/generate_stubs.py            # rewrite sidecar/pb in place
    python scripts/generate_stubs.py --out DIR  # write it all under DIR instead (the staleness test)

Both proto roots are mapped to the virtual path sidecar/pb/..., so the generated modules import
each other as sidecar.pb.contextsidecar.v1.* with no post-processing.

sidecar/pb is also the include root of the shipped contract (``context-sidecar proto`` prints
it): contextsidecar/v1/sidecar.proto and google/rpc/{status,error_details}.proto are copied there
as they are, so an installed wheel is enough to generate a client in any language. Beside the
stubs goes sidecar_descriptors.binpb, the FileDescriptorSet of the API and of google/rpc, with
their imports and source comments, which server reflection serves (the descriptors compiled
into sidecar_pb2.py carry no comments).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
API_ROOT = ROOT / "proto"  # the public contract: nothing else belongs under it
STORAGE_ROOT = ROOT / "sidecar" / "storage" / "proto"  # how LMDB records are laid out: internal
THIRD_PARTY = ROOT / "third_party"  # google/rpc, which clients need to decode error details

API_PROTO = "sidecar/pb/contextsidecar/v1/sidecar.proto"
STORAGE_PROTOS = ("sidecar/pb/contextsidecar/storage/v1/records.proto",  # messages only: no grpc stub
                  "sidecar/pb/contextsidecar/storage/v1/memory.proto")
DESCRIPTORS = "sidecar/pb/contextsidecar/v1/sidecar_descriptors.binpb"
# In the descriptor set too, so a reflection client (grpcurl) can decode an error's details.
ERROR_DETAILS = ("google/rpc/status.proto", "google/rpc/error_details.proto")
# The shipped contract: each file's path under the include root sidecar/pb, and where it comes from.
CONTRACT = {"contextsidecar/v1/sidecar.proto": API_ROOT,
            "google/rpc/status.proto": THIRD_PARTY,
            "google/rpc/error_details.proto": THIRD_PARTY}


def generate(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    well_known = resources.files("grpc_tools") / "_proto"  # google/protobuf/*.proto, shipped with protoc
    common = ["protoc", f"-Isidecar/pb={API_ROOT}", f"-Isidecar/pb={STORAGE_ROOT}", f"-I{well_known}"]
    stubs = [*common, f"--python_out={out}", f"--pyi_out={out}"]
    for args in ([*stubs, f"--grpc_python_out={out}", API_PROTO], [*stubs, *STORAGE_PROTOS],
                 [*common, f"-I{THIRD_PARTY}", "--include_source_info", "--include_imports",
                  f"--descriptor_set_out={out / DESCRIPTORS}", API_PROTO, *ERROR_DETAILS]):
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {args[-1]}")
    for name, source_root in CONTRACT.items():
        target = out / "sidecar" / "pb" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source_root / name, target)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="root to write sidecar/pb/... under")
    generate(parser.parse_args().out)
    sys.exit(0)
