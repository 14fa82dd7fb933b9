"""The project's own rules: generated stubs are fresh, imports run one way, and the stored event
record stays wire-compatible with the API's WindowEntry."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from google.protobuf import unknown_fields

from sidecar.pb.contextsidecar.storage.v1.memory_pb2 import MemoryRecord
from sidecar.pb.contextsidecar.storage.v1.records_pb2 import EventRecord
from sidecar.pb.contextsidecar.v1 import sidecar_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
WIRE = {"wire", "cli", "__main__"}  # the wire package, and the entry points that start it
STORAGE_CODEC = {"storage.codec"}  # uses only the storage proto, as its serialization format


def test_committed_stubs_are_what_the_protos_generate(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "generate_stubs.py"), "--out", str(tmp_path)], check=True)
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    committed = sorted(p.relative_to(ROOT) for p in (ROOT / "sidecar" / "pb").rglob("*")
                       if p.is_file() and p.name != "__init__.py" and "__pycache__" not in p.parts)
    assert generated == committed
    for relative in generated:
        assert (tmp_path / relative).read_bytes() == (ROOT / relative).read_bytes(), (
            f"{relative} is stale: run python scripts/generate_stubs.py")


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_imports_run_one_way() -> None:
    sources = [path for path in sorted((ROOT / "sidecar").rglob("*.py")) if "pb" not in path.parts]
    assert len(sources) > 30, sources
    for path in sources:
        module = ".".join(path.relative_to(ROOT / "sidecar").with_suffix("").parts)
        imports = imported_modules(path)
        if module.split(".")[0] not in WIRE:
            assert not any(name == "grpc" or name.startswith(("grpc.", "grpc_")) for name in imports), path
            assert not any(name.startswith("sidecar.") and name.split(".")[1] in WIRE for name in imports), path
        if module.split(".")[0] not in WIRE and module not in STORAGE_CODEC:
            assert not any(name.startswith("sidecar.pb") for name in imports), path
        if module in STORAGE_CODEC:
            assert all(not name.startswith("sidecar.pb") or ".storage." in name for name in imports), path
    # fastcore knows nothing of LMDB, protobuf or the sidecar: plain values in and out.
    fastcore_imports = set().union(*(imported_modules(p) for p in (ROOT / "fastcore").glob("*.py")))
    for line in (ROOT / "fastcore" / "_fastcore.pyx").read_text().splitlines():
        if line.startswith(("import ", "from ", "cimport ")):
            fastcore_imports.add(line.split()[1])
    assert not any(name.split(".")[0] in ("lmdb", "google", "grpc", "sidecar")
                   for name in fastcore_imports), fastcore_imports


def test_memory_records_are_memory_entries_on_the_wire() -> None:
    entry_fields = {f.number: (f.name, f.type, f.message_type and f.message_type.full_name)
                    for f in pb.MemoryEntry.DESCRIPTOR.fields}
    for field in MemoryRecord.DESCRIPTOR.fields:
        assert entry_fields[field.number] == (field.name, field.type,
                                              field.message_type and field.message_type.full_name)
    record = MemoryRecord(id="m1", content="héllo", tags=["a", "b"], tokens=2)
    record.created_at.FromMilliseconds(1_700_000_000_123)
    entry = pb.MemoryEntry.FromString(record.SerializeToString())
    assert (entry.id, entry.content, list(entry.tags), entry.tokens, entry.created_at.ToMilliseconds()) == (
        "m1", "héllo", ["a", "b"], 2, 1_700_000_000_123)
    assert len(unknown_fields.UnknownFieldSet(entry)) == 0


def test_event_records_are_window_entries_on_the_wire() -> None:
    """EventRecord may hold only WindowEntry's fields, with the same numbers and types (its
    content is the entry's text), so a stored record is a valid WindowEntry."""
    entry_fields = {f.number: (f.name, f.type) for f in pb.WindowEntry.DESCRIPTOR.fields}
    for field in EventRecord.DESCRIPTOR.fields:
        name, kind = entry_fields[field.number]
        assert kind == field.type and name == {"content": "text"}.get(field.name, field.name), field.name
    record = EventRecord(event_id="e1", seq=3, iteration=2, role="tool", type="tool_result", call_id="k",
                         content="héllo", tokens=5)
    entry = pb.WindowEntry.FromString(record.SerializeToString())
    assert (entry.event_id, entry.seq, entry.iteration, entry.role, entry.type, entry.call_id, entry.text,
            entry.tokens, entry.clipped_from_tokens) == ("e1", 3, 2, "tool", "tool_result", "k", "héllo", 5, 0)
    assert len(unknown_fields.UnknownFieldSet(entry)) == 0
