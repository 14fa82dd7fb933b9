"""Regenerate everything generated and committed: the API's Python stubs, which the client
distribution owns (clients/python/context_sidecar_client), and sidecar/pb, the server's: the
storage records' stubs and the contract the server's package ships.

    python scripts/generate_stubs.py            # rewrite them in place
    python scripts/generate_stubs.py --out DIR  # write it all under DIR instead (the staleness test)

The API proto is mapped to the virtual path context_sidecar_client/v1/sidecar.proto, so its
modules import each other as context_sidecar_client.v1.* with no post-processing. One
distribution holds them: protobuf refuses a second registration of the same messages, and the
server imports the client's. Likewise the storage protos are mapped under sidecar/pb/.

Beside the API stubs goes fields.py: for each message, a TypedDict of its fields, which the
client's methods take as keyword arguments (so a type checker sees a misspelt field or a wrong
type), and the client's own wire.proto (the few google.rpc and grpc.health messages it decodes,
under a package of its own).

sidecar/pb is also the include root of the shipped contract (``context-sidecar proto`` prints
it): contextsidecar/v1/sidecar.proto and google/rpc/{status,error_details}.proto are copied there
as they are, so an installed wheel is enough to generate a client in any language. Beside them
goes sidecar_descriptors.binpb, the FileDescriptorSet of the API and of google/rpc, with their
imports and source comments, which server reflection serves (the descriptors compiled into
sidecar_pb2.py carry no comments).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from importlib import resources
from pathlib import Path

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
API_ROOT = ROOT / "proto"  # the public contract: nothing else belongs under it
STORAGE_ROOT = ROOT / "sidecar" / "storage" / "proto"  # how LMDB records are laid out: internal
THIRD_PARTY = ROOT / "third_party"  # google/rpc, which clients need to decode error details
CLIENT = Path("clients/python")  # the client distribution's root: its package is generated into

API_PROTO = "context_sidecar_client/v1/sidecar.proto"
CLIENT_PROTOS = ("context_sidecar_client/wire.proto",)  # the client's own, beside its code
STORAGE_PROTOS = ("sidecar/pb/contextsidecar/storage/v1/records.proto",  # messages only: no grpc stub
                  "sidecar/pb/contextsidecar/storage/v1/memory.proto")
CONTRACT_PROTO = "sidecar/pb/contextsidecar/v1/sidecar.proto"
DESCRIPTORS = "sidecar/pb/contextsidecar/v1/sidecar_descriptors.binpb"
FIELDS = CLIENT / "context_sidecar_client" / "fields.py"
# In the descriptor set too, so a reflection client (grpcurl) can decode an error's details.
ERROR_DETAILS = ("google/rpc/status.proto", "google/rpc/error_details.proto")
# The shipped contract: each file's path under the include root sidecar/pb, and where it comes from.
CONTRACT = {"contextsidecar/v1/sidecar.proto": API_ROOT,
            "google/rpc/status.proto": THIRD_PARTY,
            "google/rpc/error_details.proto": THIRD_PARTY}


def generate(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for folder in (out / CLIENT, (out / DESCRIPTORS).parent):
        folder.mkdir(parents=True, exist_ok=True)
    well_known = resources.files("grpc_tools") / "_proto"  # google/protobuf/*.proto, shipped with protoc
    server = ["protoc", f"-Isidecar/pb={API_ROOT}", f"-Isidecar/pb={STORAGE_ROOT}", f"-I{well_known}"]
    client = ["protoc", f"-Icontext_sidecar_client/v1={API_ROOT / 'contextsidecar' / 'v1'}",
              f"-I{ROOT / CLIENT}", f"-I{well_known}", f"--python_out={out / CLIENT}", f"--pyi_out={out / CLIENT}"]
    for args in ([*client, f"--grpc_python_out={out / CLIENT}", API_PROTO], [*client, *CLIENT_PROTOS],
                 [*server, f"--python_out={out}", f"--pyi_out={out}", *STORAGE_PROTOS],
                 [*server, f"-I{THIRD_PARTY}", "--include_source_info", "--include_imports",
                  f"--descriptor_set_out={out / DESCRIPTORS}", CONTRACT_PROTO, *ERROR_DETAILS]):
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {args[-1]}")
    for name, source_root in CONTRACT.items():
        target = out / "sidecar" / "pb" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source_root / name, target)
    api = next(file for file in descriptor_pb2.FileDescriptorSet.FromString((out / DESCRIPTORS).read_bytes()).file
               if file.name == CONTRACT_PROTO)
    (out / FIELDS).write_text(typed_fields(api), encoding="utf-8")


# fields.py: a TypedDict per message.

FIELD = descriptor_pb2.FieldDescriptorProto
SCALARS = {FIELD.TYPE_STRING: "str", FIELD.TYPE_BYTES: "bytes", FIELD.TYPE_BOOL: "bool", FIELD.TYPE_DOUBLE: "float",
           FIELD.TYPE_FLOAT: "float"}  # and every integer type: int
# What a message field takes besides the message itself: its TypedDict, or for a well-known type
# what protobuf's constructor also accepts.
WELL_KNOWN = {".google.protobuf.Timestamp": "_timestamp_pb2.Timestamp | _datetime.datetime"}


def typed_fields(api: descriptor_pb2.FileDescriptorProto) -> str:
    package = f".{api.package}."
    messages: list[tuple[str, descriptor_pb2.DescriptorProto]] = []

    def collect(prefix: str, message: descriptor_pb2.DescriptorProto) -> None:
        if message.options.map_entry:
            return
        messages.append((prefix + message.name, message))
        for nested in message.nested_type:
            collect(f"{prefix}{message.name}.", nested)

    for message in api.message_type:
        collect("", message)
    map_entries = {f"{package}{name}.{nested.name}": nested for name, message in messages
                   for nested in message.nested_type if nested.options.map_entry}

    def value_type(field: descriptor_pb2.FieldDescriptorProto) -> str:
        if field.type == field.TYPE_MESSAGE:
            if field.type_name in WELL_KNOWN:
                return WELL_KNOWN[field.type_name]
            name = field.type_name.removeprefix(package)
            return f"_pb.{name} | {name.replace('.', '_')}"
        if field.type == field.TYPE_ENUM:
            return "int | str"  # the value's number or its name
        return SCALARS.get(field.type, "int")

    def field_type(field: descriptor_pb2.FieldDescriptorProto) -> str:
        if field.label != field.LABEL_REPEATED:
            return value_type(field)
        entry = map_entries.get(field.type_name)
        if entry is not None:
            return f"_Mapping[{value_type(entry.field[0])}, {value_type(entry.field[1])}]"
        return f"_Iterable[{value_type(field)}]"

    lines = ['"""Generated by scripts/generate_stubs.py from the API proto: do not edit.',
             "",
             "Each message's fields, as a TypedDict: what the client's methods take as keyword arguments,",
             "and what a nested message may be given as instead of the message itself.",
             '"""',
             "",
             "from __future__ import annotations",
             "",
             "import datetime as _datetime",
             "from collections.abc import Iterable as _Iterable",
             "from collections.abc import Mapping as _Mapping",
             "from typing import TypedDict",
             "",
             "from google.protobuf import timestamp_pb2 as _timestamp_pb2",
             "",
             "from context_sidecar_client.v1 import sidecar_pb2 as _pb",
             "",
             "__all__ = [",
             *(f'    "{name.replace(".", "_")}",' for name, _ in messages),
             "]"]
    for name, message in messages:
        lines += ["", "", f"class {name.replace('.', '_')}(TypedDict, total=False):"]
        lines += [f"    {field.name}: {field_type(field)}" for field in message.field] or ["    pass"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="root to write sidecar/pb/... and clients/python under")
    generate(parser.parse_args().out)
    sys.exit(0)
