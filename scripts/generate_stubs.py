"""Regenerate the committed Python stubs in sidecar/pb from proto/ (the API) and
sidecar/storage/proto/ (the storage records, which are no part of the API).

    python scripts/generate_stubs.py            # rewrite sidecar/pb in place
    python scripts/generate_stubs.py --out DIR  # write them under DIR instead (the staleness test)

Both roots are mapped to the virtual path sidecar/pb/..., so the generated modules import each
other as sidecar.pb.contextsidecar.v1.* with no post-processing.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
API_PROTO = "sidecar/pb/contextsidecar/v1/sidecar.proto"
STORAGE_PROTOS = ("sidecar/pb/contextsidecar/storage/v1/records.proto",  # messages only: no grpc stub
                  "sidecar/pb/contextsidecar/storage/v1/memory.proto")


def generate(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    well_known = resources.files("grpc_tools") / "_proto"  # google/protobuf/*.proto, shipped with protoc
    common = ["protoc", f"-Isidecar/pb={ROOT / 'proto'}", f"-Isidecar/pb={ROOT / 'sidecar' / 'storage' / 'proto'}",
              f"-I{well_known}", f"--python_out={out}",
              f"--pyi_out={out}"]
    for args in (common + [f"--grpc_python_out={out}", API_PROTO], common + list(STORAGE_PROTOS)):
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {args[-1]}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="root to write sidecar/pb/... under")
    generate(parser.parse_args().out)
    sys.exit(0)
