"""The house rules, checked: imports run one way (the client's distribution apart from the
server), each area imports only the areas below it, LMDB stays in storage and the areas' schema
modules, each database belongs to one area and is named only there, every error has its row in
the error table, and the tests mirror the code. Each rule is a function over a source root that
returns its violations, so each is checked twice: the real tree has none, and a small tree built
here that breaks the rule has the violation reported (a rule that cannot fail proves nothing).
Also: the generated stubs are fresh, and stored records stay wire-compatible with the API."""

from __future__ import annotations

import ast
import re
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb
from google.protobuf import unknown_fields

from benchmarks._lib import registry
from sidecar.errors import SidecarError
from sidecar.pb.contextsidecar.storage.v1.memory_pb2 import MemoryRecord
from sidecar.pb.contextsidecar.storage.v1.records_pb2 import EventRecord
from tests.helpers import ROOT

# Each area's folder in sidecar/ and its key in sidecar/storage/databases.py AREAS.
AREA_DATABASES = {"transcript": "runs", "context_window": "run_context", "memory": "memory",
                  "tenant_events": "tenant_events"}
# The areas' order, top to bottom: an area may import only the areas of the rows below its own
# (none of its row). The transcript (the turn) uses the context window (sections, profiles,
# renderings, policy); memory compaction reads the tenant's event log.
AREA_ORDER = (
    ("transcript", "memory"),
    ("context_window", "tenant_events"),
)
SHARED = ("errors.py", "settings.py", "validation.py", "caching.py")  # used by every layer, so they use none
ENTRY_POINTS = ("cli.py", "__main__.py")  # start the server: above the wire, not below it
STORAGE_STUBS = "sidecar.pb.contextsidecar.storage"  # the stored format, read by storage/codec.py alone
CLIENT = "context_sidecar_client"  # the Python client's distribution (clients/python), which owns the API stubs
API_STUBS = f"{CLIENT}.v1"


# Reading a tree: which files, what each imports.

def sources(root: Path) -> list[Path]:
    """The code the rules cover, relative to root: sidecar/ (its generated stubs aside) and
    fastcore/, Python and Cython."""
    found = [path for path in (root / "sidecar").rglob("*.py") if "pb" not in path.relative_to(root).parts[:2]]
    found += [*(root / "fastcore").glob("*.py"), *(root / "fastcore").glob("*.pyx")]
    return sorted(path.relative_to(root) for path in found)


def client_sources(root: Path) -> list[Path]:
    """The client distribution's own code, relative to root (its generated modules aside)."""
    package = root / "clients" / "python" / CLIENT
    return sorted(path.relative_to(root) for path in package.glob("*.py")
                  if not path.stem.endswith("_pb2") and path.name != "fields.py")


def module_of(relative: Path) -> list[str]:
    """The dotted name of a source file, as parts (a package's __init__ is the package)."""
    parts = list(relative.with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported(root: Path, relative: Path) -> set[str]:
    """Every module a file imports, anywhere in it (a function's own imports too), relative
    imports resolved; ``from a import b`` counts as both ``a`` and ``a.b``, since b may be a module."""
    text = (root / relative).read_text(encoding="utf-8")
    if relative.suffix == ".pyx":  # Cython is no Python syntax: its import lines, read as text
        names = set()
        for line in text.splitlines():
            found = re.match(r"\s*(?:from\s+([\w.]+)\s+c?import\b|c?import\s+([\w., ]+))", line)
            if found:
                names.update(name.strip().split(" ")[0] for name in (found[1] or found[2]).split(",") if name.strip())
        return names
    package = module_of(relative) if relative.stem == "__init__" else module_of(relative)[:-1]
    names = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join([*package[:len(package) - node.level + 1], *([node.module] if node.module else [])]
                            if node.level else [node.module or ""])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def within(name: str, *packages: str) -> bool:
    return any(name == package or name.startswith(package + ".") for package in packages)


def outermost(names: set[str]) -> list[str]:
    """The names not within another of them: ``from a import b`` is reported once, as a."""
    return sorted(name for name in names if not any(other != name and within(name, other) for other in names))


def layer_of(relative: Path) -> str:
    """wire, inspector, client, bench, entry, area, storage, text, telemetry, shared, fastcore, or
    package (sidecar/__init__, plugin_api)."""
    parts = relative.parts
    if parts[0] == "fastcore":
        return "fastcore"
    if len(parts) == 2:
        return "entry" if parts[1] in ENTRY_POINTS else "shared" if parts[1] in SHARED else "package"
    return "area" if parts[1] in AREA_DATABASES else parts[1]


def layer_imported(name: str) -> str | None:
    """The sidecar layer an imported module belongs to (None: not the sidecar's)."""
    if within(name, CLIENT):
        return "API stubs" if within(name, API_STUBS) else "client"
    if not within(name, "sidecar") or name == "sidecar":
        return None
    first = name.split(".")[1]
    if first == "pb":
        return "storage stubs"
    if first in ("cli", "__main__"):
        return "entry"
    if first in ("errors", "settings", "validation", "caching"):
        return f"shared {first}"
    return "area" if first in AREA_DATABASES else first


# a. Layers: sidecar/wire -> areas -> storage, text, fastcore; errors, settings, validation below all;
# sidecar/telemetry beside them, for every layer to record to (it imports only settings and errors).
# The client (its own distribution, clients/python) imports nothing of the server (a host installs
# it without the server's dependencies). It owns the API stubs, which of the server only
# sidecar/wire imports; nothing of the server imports the client but sidecar/bench, a host-side
# tool: the bench imports of the sidecar only the client (and no grpc or stubs of its own: it
# calls as a host does), and only the entry (cli.py) imports it.
# sidecar/telemetry is cross-cutting like errors and settings: every layer of the server may import
# it, and it imports nothing of the sidecar except those two.
# sidecar/inspector (the run inspector's web page) stands beside the wire, over the areas: it imports
# no wire (nor grpc or the API stubs), and only the entry (cli.py) imports it.

FORBIDDEN = {
    "area": {"wire", "entry", "inspector"},
    "storage": {"area", "text", "wire", "entry", "inspector"},
    "text": {"area", "storage", "wire", "entry", "inspector"},
    "inspector": {"wire", "entry", "bench"},
    "wire": {"inspector"},
}


def layer_violation(layer: str, relative: Path, name: str) -> str | None:
    target = layer_imported(name)
    if layer == "client":
        return "but the client imports nothing of the server" if within(name, "sidecar", "fastcore") else None
    if layer != "wire" and (within(name, "grpc", "google.rpc") or name.startswith("grpc_") or target == "API stubs"):
        return "which only sidecar/wire and the client may import"
    if target == "client" and layer != "bench":
        return f"but nothing of the sidecar imports the client, {CLIENT} (except sidecar/bench)"
    if layer == "bench" and target not in (None, "bench", "client"):
        return f"but sidecar/bench imports nothing of the sidecar except the client, {CLIENT}"
    if target == "bench" and layer not in ("bench", "entry"):
        return "but nothing of the sidecar imports sidecar/bench except sidecar/cli.py"
    if target == "storage stubs" and relative.as_posix() != "sidecar/storage/codec.py":
        return "which only sidecar/storage/codec.py may import"
    if layer == "fastcore" and within(name, "sidecar", "lmdb", "grpc", "google"):
        return "but fastcore takes plain values in and out"
    if layer == "telemetry" and target not in (None, "telemetry", "shared errors", "shared settings"):
        return "but sidecar/telemetry imports nothing of the sidecar except settings and errors"
    if layer == "shared" and target not in (None, "shared errors"):
        return "but errors, settings, validation and caching import nothing of the sidecar except sidecar.errors"
    if target in FORBIDDEN.get(layer, ()):
        return f"but the {layer} layer may not import the {target} layer"
    return None


def layer_violations(root: Path) -> list[str]:
    violations = []
    for relative in [*sources(root), *client_sources(root)]:
        layer = "client" if relative.parts[0] == "clients" else layer_of(relative)
        wrong = {name: why for name in imported(root, relative) if (why := layer_violation(layer, relative, name))}
        violations += [f"{relative}: imports {name}, {wrong[name]}" for name in outermost(set(wrong))]
    return violations


def plugin_violations(root: Path) -> list[str]:
    """A plugin sees the sidecar only through sidecar.plugin_api."""
    return [f"{relative}: imports {name}; a plugin may import only sidecar.plugin_api"
            for relative in sorted(path.relative_to(root) for path in (root / "tests" / "plugin").glob("*.py"))
            for name in outermost({name for name in imported(root, relative) if within(name, "sidecar")
                                   and name != "sidecar" and not within(name, "sidecar.plugin_api")})]


# a2. Areas: each imports only the areas below it (AREA_ORDER). An import under ``if TYPE_CHECKING``
# counts too: the lower area is then written in terms of the upper one's types (a change there
# breaks its type check), which is the arrow the order forbids; a Protocol or plain values of the
# lower area's own say what it needs instead.

def area_rank(area: str) -> int:
    """The area's row in AREA_ORDER, counted from the bottom."""
    return next(len(AREA_ORDER) - row for row, areas in enumerate(AREA_ORDER) if area in areas)


def area_order_violations(root: Path) -> list[str]:
    violations = []
    for relative in sources(root):
        if layer_of(relative) != "area":
            continue
        mine = relative.parts[1]
        upward = {name for name in imported(root, relative) if layer_imported(name) == "area"
                  and (theirs := name.split(".")[1]) != mine and area_rank(theirs) >= area_rank(mine)}
        below = sorted(area for area in AREA_DATABASES if area_rank(area) < area_rank(mine))
        violations += [f"{relative}: imports {name}, but the area {mine} imports only areas below it "
                       f"({', '.join(below) or 'none'})" for name in outermost(upward)]
    return violations


# b. LMDB: storage and each area's schema module.

def lmdb_violations(root: Path) -> list[str]:
    return [f"{relative}: imports lmdb; only sidecar/storage and sidecar/<area>/schema.py may"
            for relative in sources(root) if relative.parts[0] == "sidecar"
            and "lmdb" in {name.split(".")[0] for name in imported(root, relative)}
            and not (layer_of(relative) == "storage"
                     or (layer_of(relative) == "area" and relative.name == "schema.py" and len(relative.parts) == 3))]


# c. Database ownership: one area each (sidecar/storage/databases.py AREAS), named only there.

def declared(root: Path, constant: str, default: object = None) -> Any:
    """A constant as sidecar/storage/databases.py writes it (read, not imported: root may be any
    tree)."""
    for node in ast.parse((root / "sidecar" / "storage" / "databases.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(target, ast.Name) and target.id == constant for target in targets):
                return ast.literal_eval(node.value)
    if default is None:
        raise AssertionError(f"sidecar/storage/databases.py declares no {constant}")
    return default


def declared_areas(root: Path) -> dict[str, tuple[bytes, ...]]:
    return declared(root, "AREAS")


def database_names(tree: ast.AST) -> Iterator[tuple[int, str, str]]:
    """(line, "database"|"area", name) for each database a module names as ``<...db>["name"]`` or
    ``handles(...)["name"]``, and each area it asks for as ``handles("area", ...)``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, str):
            held = node.value
            if isinstance(held, ast.Call):
                held = held.func
            name = held.id if isinstance(held, ast.Name) else held.attr if isinstance(held, ast.Attribute) else ""
            if name.endswith("db") or name == "handles":
                yield node.lineno, "database", node.slice.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name) \
                and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "handles":
            for argument in node.args:
                if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                    yield node.lineno, "area", argument.value


def database_violations(root: Path) -> list[str]:
    areas = declared_areas(root)
    violations = []
    owners: dict[bytes, list[str]] = {}
    for area, names in areas.items():
        for name in names:
            owners.setdefault(name, []).append(area)
    violations += [f"sidecar/storage/databases.py: database {name.decode()} is in {len(found)} areas "
                   f"({', '.join(found)})" for name, found in owners.items() if len(found) > 1]
    for relative in sources(root):
        if relative.suffix != ".py":
            continue
        tree = ast.parse((root / relative).read_text(encoding="utf-8"))
        if relative.as_posix() != "sidecar/storage/environment.py":
            violations += [f"{relative}:{node.lineno}: calls open_db; only sidecar/storage/environment.py opens "
                           "databases"
                           for node in ast.walk(tree) if isinstance(node, ast.Call)
                           and isinstance(node.func, ast.Attribute) and node.func.attr == "open_db"]
        layer = layer_of(relative)
        own = AREA_DATABASES.get(relative.parts[1]) if layer == "area" else None
        for line, kind, name in database_names(tree):
            where = f"{relative}:{line}"
            if kind == "area":
                tied = {frozenset(pair) for pair in declared(root, "TIED_AREAS", ())}
                if layer == "area" and name != own and frozenset((name, own)) not in tied:
                    violations.append(f"{where}: asks for the handles of area {name}; its own area is {own}")
                continue
            found = owners.get(name.encode())
            if not found:
                violations.append(f"{where}: names database {name}, which no area declares")
            elif layer == "area" and own not in found:
                violations.append(f"{where}: names database {name} of area {found[0]}; its own area is {own}")
            elif layer not in ("area", "storage"):
                violations.append(f"{where}: names database {name} of area {found[0]} outside that area")
    return violations


# d. The error table: each error class one code, one status, one row in docs/errors.md. Two classes
# may share a code only with different statuses (WriteConflict, ABORTED, beside Conflict's
# ALREADY_EXISTS), so that a client always tells them apart.

def error_classes(root: Path) -> dict[str, tuple[str, object, object]]:
    """Every subclass of SidecarError (and itself) declared under sidecar/, read from the source:
    class name -> (where, code, status), each attribute inherited when the class does not set it."""
    declared: dict[str, tuple[str, list[str], dict[str, object]]] = {}
    for relative in sources(root):
        if relative.suffix == ".py":
            for node in ast.walk(ast.parse((root / relative).read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef):
                    own = {target.id: statement.value.value for statement in node.body
                           if isinstance(statement, ast.Assign | ast.AnnAssign)
                           and isinstance(statement.value, ast.Constant)
                           for target in (statement.targets if isinstance(statement, ast.Assign)
                                          else [statement.target])
                           if isinstance(target, ast.Name) and target.id in ("code", "status")}
                    bases = [base.id if isinstance(base, ast.Name) else base.attr for base in node.bases
                             if isinstance(base, ast.Name | ast.Attribute)]
                    declared[node.name] = (f"{relative}:{node.lineno}", bases, own)

    def lineage(name: str) -> list[str]:
        """The class and its first bases, up to SidecarError or a class not declared here."""
        chain = [name]
        while chain[-1] != "SidecarError" and declared.get(chain[-1], ("", [], {}))[1] \
                and declared[chain[-1]][1][0] not in chain:
            chain.append(declared[chain[-1]][1][0])
        return chain

    def attribute(chain: list[str], key: str) -> object:
        return next((declared[name][2][key] for name in chain if key in declared[name][2]), None)

    found = {}
    for name, (where, _, _) in declared.items():  # in the order declared: a duplicate is the later class
        chain = lineage(name)
        if chain[-1] == "SidecarError" and "SidecarError" in declared:
            found[name] = (where, attribute(chain, "code"), attribute(chain, "status"))
    return found


def error_class_violations(root: Path) -> list[str]:
    statuses = {code.name for code in grpc.StatusCode}
    violations = []
    seen: dict[tuple[str, object], str] = {}
    for name, (where, code, status) in error_classes(root).items():
        if not isinstance(code, str) or not code:
            violations.append(f"{where}: {name} has no code")
        elif (code, status) in seen:
            violations.append(f"{where}: {name} has the code {code!r} and status {status} of {seen[code, status]}")
        else:
            seen[code, status] = name
        if status not in statuses:
            violations.append(f"{where}: {name} has the status {status!r}, which is no grpc.StatusCode")
    return violations


def undocumented_errors(root: Path) -> list[str]:
    """docs/errors.md has a table whose first column is each code in backticks."""
    table = root / "docs" / "errors.md"
    if not table.is_file():
        return ["docs/errors.md is missing: the error table lives there"]
    documented = set(re.findall(r"^\|\s*`([^`]+)`", table.read_text(encoding="utf-8"), re.MULTILINE))
    return [f"{where}: {name}'s code {code!r} has no row in docs/errors.md"
            for name, (where, code, _) in sorted(error_classes(root).items())
            if isinstance(code, str) and code and code not in documented]  # no code at all: the class rule's


# f. The layout map: docs/layout.md names every module where it is, and names nothing that is not.

def mapped_files(text: str) -> set[str]:
    """The files a layout map names: a line starting with a folder (``sidecar/wire/``) opens it for
    the indented names below it; a path at the start of a line names itself."""
    named, folder = set(), ""
    for line in text.splitlines():
        if line and not line[0].isspace():
            first = line.split()[0]
            folder = first if first.endswith("/") else ""
            names = re.findall(r"[\w./]+\.pyx?\b", line[len(first):]) if folder else []
            named |= {first} if re.fullmatch(r"[\w./]+\.pyx?", first) else set()
        else:
            names = re.findall(r"[\w./]+\.pyx?\b", line)
        named |= {name if "/" in name else folder + name for name in names if folder}  # a/b.py: a path
    return named


def maps_in(page: Path) -> set[str]:
    """The files named by the page's plain code blocks (those with no language: the maps)."""
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", page.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)
    return set().union(set(), *(mapped_files(block) for language, block in blocks if not language))


def layout_map_violations(root: Path) -> list[str]:
    page = root / "docs" / "layout.md"
    if not page.is_file():
        return ["docs/layout.md is missing: the layout map lives there"]
    named = maps_in(page)
    modules = {path.relative_to(root).as_posix() for folder in ("sidecar", "fastcore")
               for path in (root / folder).rglob("*.py*") if path.suffix in (".py", ".pyx")
               and path.name != "__init__.py" and "pb" not in path.relative_to(root).parts}
    return ([f"{module}: not in the layout map (docs/layout.md)" for module in sorted(modules - named)]
            + [f"docs/layout.md names {name}, which does not exist" for name in sorted(named - modules)
               if name.startswith(("sidecar/", "fastcore/"))])


# e. The tests: folders that mirror the code, sharing tests/helpers.py and nothing else. Two
# folders stand apart: plugin/ (a package the plugin tests install) and specification/ (the
# executable specification, which spans every area: its model, its sidecars and its state
# machine are modules of its own, shared within it alone).
STANDING_APART = ("plugin", "specification")

def mirroring_violations(root: Path) -> list[str]:
    violations = []
    tests = root / "tests"
    for folder in sorted(path for path in tests.rglob("*") if path.is_dir()):
        relative = folder.relative_to(tests)
        if relative.parts[0] in STANDING_APART or any(part == "__pycache__" or part.startswith(".")
                                                for part in relative.parts):
            continue
        client = root / "clients" / "python" / CLIENT / Path(*relative.parts[1:])  # tests/client/: the client's
        mirrored = (root / relative if relative.parts[0] == "fastcore" else client if relative.parts[0] == "client"
                    else root / "sidecar" / relative)
        if not mirrored.is_dir():
            violations.append(f"tests/{relative.as_posix()}: names no folder of sidecar/, fastcore/ or the client")
        if not (folder / "__init__.py").is_file():
            violations.append(f"tests/{relative.as_posix()}: has no __init__.py")
    return violations


def shared_helpers_violations(root: Path) -> list[str]:
    """A test module imports, of the tests, only tests.helpers (fixtures come from conftest.py
    through pytest, never by import); a module of tests/specification also its own folder's."""
    def shared_with(relative: Path) -> tuple[str, ...]:
        return ("tests.helpers", "tests.specification") if relative.parts[1] == "specification" else ("tests.helpers",)
    return [f"{relative}: imports {name}; tests share only tests.helpers"
            for relative in sorted(path.relative_to(root) for path in (root / "tests").rglob("*.py")
                                   if "plugin" not in path.relative_to(root).parts)
            for name in outermost({name for name in imported(root, relative) if within(name, "tests")
                                   and name != "tests"
                                   and not any(within(name, shared) for shared in shared_with(relative))})]


# g. The benchmarks: every bench_*.py in the registry (benchmarks/README.md's table) and every
# row a file; imports one way: the benchmarks use nothing of the tests, the tests only benchmarks/_lib.

def benchmark_registry_violations(root: Path) -> list[str]:
    return registry.violations(root)


def benchmark_import_violations(root: Path) -> list[str]:
    def files(folder: str) -> list[Path]:
        return sorted(path.relative_to(root) for path in (root / folder).rglob("*.py"))

    def of(relative: Path, package: str, allowed: str) -> list[str]:
        return outermost({name for name in imported(root, relative)
                          if within(name, package) and not within(name, allowed)})

    return ([f"{relative}: imports {name}; the benchmarks import nothing of the tests"
             for relative in files("benchmarks") for name in of(relative, "tests", "")]
            + [f"{relative}: imports {name}; of the benchmarks, the tests import only benchmarks._lib"
               for relative in files("tests") for name in of(relative, "benchmarks", "benchmarks._lib")])


# h. Byte layouts written once. sidecar/transcript/schema.py declares the count record (its struct
# and its fields' offsets), sidecar/transcript/log.py the order of NewEvent's fields, and the twin
# of fastcore's _entries the event rules' order. The compiled modules read and write those bytes
# by offset, an event tuple by position and a rule by its bit, so their constants, and the
# twins', must say the same: read from the source, so a constant changed there is caught before
# anything is built.

LAYOUT_FILES = ("sidecar/transcript/schema.py", "sidecar/transcript/log.py", "fastcore/_entries_reference.py",
                "fastcore/_fastcore_reference.py", "fastcore/_entries.pyx", "fastcore/_fastcore.pyx")


def literals(root: Path, relative: str) -> dict[str, Any]:
    """A Python module's top-level names bound to literals, a ``struct.Struct(format)`` as its
    format; and, for a class, its fields in order (``name._fields``)."""
    found: dict[str, Any] = {}
    for node in ast.parse((root / relative).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef):
            found[f"{node.name}._fields"] = tuple(
                item.target.id for item in node.body if isinstance(item, ast.AnnAssign)
                and isinstance(item.target, ast.Name))
        if not isinstance(node, ast.Assign):
            continue
        value = node.value
        if isinstance(value, ast.Call) and ast.unparse(value.func) == "struct.Struct":
            value = value.args[0]
        try:
            literal = ast.literal_eval(value)
        except ValueError:
            continue
        for target in node.targets:
            if isinstance(target, ast.Name):
                found[target.id] = literal
            elif isinstance(target, ast.Tuple) and isinstance(literal, tuple):
                found.update((name.id, item) for name, item in zip(target.elts, literal) if isinstance(name, ast.Name))
    return found


def enum_members(root: Path, relative: str) -> dict[str, int]:
    """The members of a .pyx source's ``cdef enum:`` blocks and its tuple ``EVENT_RULES``."""
    source = (root / relative).read_text(encoding="utf-8")
    found: dict[str, Any] = {}
    for block in re.finditer(r"^cdef enum:\n((?:[ \t]+\w+ = [^\n]+\n)+)", source, re.MULTILINE):
        for name, value in re.findall(r"^[ \t]+(\w+) = ([^\n#]+)", block.group(1), re.MULTILINE):
            found[name] = eval(value, {"__builtins__": {}})  # the module's own constants: 12, 1 << 3
    rules = re.search(r"^EVENT_RULES = (\([^)]*\))", source, re.MULTILINE)
    if rules:
        found["EVENT_RULES"] = ast.literal_eval(rules.group(1))
    return found


def layout_violations(root: Path) -> list[str]:
    schema, log = literals(root, LAYOUT_FILES[0]), literals(root, LAYOUT_FILES[1])
    entries_twin, fastcore_twin = literals(root, LAYOUT_FILES[2]), literals(root, LAYOUT_FILES[3])
    record = {"_RECORD_SIZE": struct.calcsize(schema["COUNT_RECORD"]), "_TOKENS_AT": schema["TOKENS_AT"],
              "_ITERATION_AT": schema["ITERATION_AT"], "_GROUP_FIRST_AT": schema["GROUP_FIRST_AT"]}
    fields = log["NewEvent._fields"]
    # The fields new_entries reads, each at its place in a NewEvent; each rule's bit, its place.
    read = {f"_{name.upper()}": fields.index(name) if name in fields else None for name in entries_twin["EVENT_FIELDS"]}
    rules = {f"_RULE_{rule.upper()}": 1 << bit for bit, rule in enumerate(entries_twin["EVENT_RULES"])}
    said = {LAYOUT_FILES[4]: {**record, **read, **rules, "EVENT_RULES": entries_twin["EVENT_RULES"]},
            LAYOUT_FILES[5]: record}
    violations = [f"{relative}: {name} is {enum_members(root, relative).get(name)}, but the layout it reads says "
                  f"{value} ({LAYOUT_FILES[0]}, NewEvent in {LAYOUT_FILES[1]}, EVENT_RULES in {LAYOUT_FILES[2]})"
                  for relative, expected in said.items() for name, value in expected.items()
                  if enum_members(root, relative).get(name) != value]
    for relative, name, value in ((LAYOUT_FILES[2], "_COUNT_RECORD", entries_twin.get("_COUNT_RECORD")),
                                  (LAYOUT_FILES[3], "_RECORD", fastcore_twin.get("_RECORD")),
                                  (LAYOUT_FILES[3], "RECORD_SIZE", fastcore_twin.get("RECORD_SIZE"))):
        expected = record["_RECORD_SIZE"] if name == "RECORD_SIZE" else schema["COUNT_RECORD"]
        if value != expected:
            violations.append(f"{relative}: {name} is {value!r}, but {LAYOUT_FILES[0]} says {expected!r}")
    if tuple(fields[:len(entries_twin["EVENT_FIELDS"])]) != tuple(entries_twin["EVENT_FIELDS"]):
        violations.append(f"{LAYOUT_FILES[2]}: EVENT_FIELDS are not the first fields of NewEvent")
    return violations


# The real tree keeps every rule.

def test_the_real_tree_is_read_whole() -> None:
    found = sources(ROOT)
    assert len(found) > 40 and Path("fastcore/_fastcore.pyx") in found and Path("sidecar/wire/server.py") in found
    assert all(layer_of(path) in ("wire", "inspector", "bench", "entry", "area", "storage", "text", "shared",
                                  "telemetry", "fastcore", "package")
               for path in found), {path: layer_of(path) for path in found}
    assert Path("sidecar/telemetry/metrics.py") in found and Path("sidecar/inspector/server.py") in found
    assert "context_sidecar_client.v1.sidecar_pb2" in imported(ROOT, Path("sidecar/wire/servicer.py"))
    assert Path("clients/python/context_sidecar_client/sync.py") in client_sources(ROOT)


def test_imports_run_one_way() -> None:
    assert layer_violations(ROOT) == []


def test_areas_import_only_areas_below_them() -> None:
    assert sorted(area for areas in AREA_ORDER for area in areas) == sorted(AREA_DATABASES)  # each area once
    assert area_order_violations(ROOT) == []


def test_plugins_see_only_the_plugin_api() -> None:
    assert plugin_violations(ROOT) == []


def test_only_storage_and_the_schema_modules_import_lmdb() -> None:
    assert lmdb_violations(ROOT) == []


def test_each_database_is_named_only_in_its_own_area() -> None:
    assert database_violations(ROOT) == []


def test_every_error_class_has_one_code_and_a_status() -> None:
    assert error_class_violations(ROOT) == []
    # The source, read, holds the same classes as the running code: the rule misses none.
    running, pending = {SidecarError}, list(SidecarError.__subclasses__())
    while pending:
        running.add(cls := pending.pop())
        pending += cls.__subclasses__()
    assert {(name, code, status) for name, (_, code, status) in error_classes(ROOT).items()} == {
        (cls.__name__, cls.code, cls.status) for cls in running}


def test_every_error_code_is_in_the_error_table() -> None:
    assert undocumented_errors(ROOT) == []


def test_the_layout_map_names_every_module_where_it_is() -> None:
    assert layout_map_violations(ROOT) == []


def test_the_readme_layout_map_names_only_files_that_exist() -> None:
    named = maps_in(ROOT / "README.md")
    assert len(named) > 30, named  # the map was read
    assert sorted(name for name in named if not (ROOT / name).is_file()) == []


def test_a_module_left_out_of_the_layout_map_or_a_file_it_names_wrongly_is_reported(tmp_path: Path) -> None:
    map_ = "```\nsidecar/cli.py  flags\nsidecar/wire/  server.py,\n  splice.py\nfastcore/\n  _fastcore.pyx\n```\n"
    files = {"sidecar/cli.py": "", "sidecar/wire/__init__.py": "", "sidecar/wire/server.py": "",
             "sidecar/wire/splice.py": "", "fastcore/_fastcore.pyx": "", "docs/layout.md": map_}
    assert layout_map_violations(build(tmp_path, files)) == []
    (tmp_path / "sidecar" / "wire" / "auth.py").write_text("")
    (tmp_path / "docs" / "layout.md").write_text(map_.replace("splice.py", "splices.py"))
    assert layout_map_violations(tmp_path) == [
        "sidecar/wire/auth.py: not in the layout map (docs/layout.md)",
        "sidecar/wire/splice.py: not in the layout map (docs/layout.md)",
        "docs/layout.md names sidecar/wire/splices.py, which does not exist"]


def test_the_tests_mirror_the_code_and_share_only_helpers() -> None:
    assert mirroring_violations(ROOT) == []
    assert shared_helpers_violations(ROOT) == []


def test_every_benchmark_is_registered_and_the_benchmarks_import_no_test() -> None:
    assert len(registry.rows(ROOT)) >= 10  # the table was read
    assert benchmark_registry_violations(ROOT) == []
    assert benchmark_import_violations(ROOT) == []


# Each rule fails on a tree that breaks it.

def build(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


DATABASES = 'AREAS = {"runs": (b"events", b"windows"), "run_context": (b"usage",), "memory": (b"mem_docs",)}\n'
ERRORS = '''
class SidecarError(Exception):
    code = "internal"
    status = "INTERNAL"


class NotFound(SidecarError):
    code = "not_found"
    status = "NOT_FOUND"
'''
BENCH_REGISTRY = """# Benchmarks

| bench | measures | command | smoke |
|---|---|---|---|
| `bench_memory.py` | ListMemory | `python -m benchmarks.bench_memory` | `python -m benchmarks.bench_memory --smoke` |
| `bench_turn.py` | turns | `python -m benchmarks.bench_turn` | `python -m benchmarks.bench_turn --smoke` (a note) |
"""
# A tree that keeps every rule: what each rule allows, so a rule that reports too much fails too.
LAWFUL = {
    "sidecar/__init__.py": "",
    "sidecar/__main__.py": "from sidecar.cli import main\n",
    "sidecar/cli.py": ("from sidecar.wire.server import serve\nfrom sidecar.settings import load_settings\n"
                       "from sidecar.inspector.server import Inspector\n\n\n"
                       "def bench(argv):\n    from sidecar.bench.command import main\n"),
    "sidecar/inspector/server.py": ("from sidecar.transcript.transcripts import Transcripts\n"
                                    "from sidecar.text.fencing import is_fenced\nfrom sidecar.errors import NotFound\n"
                                    "from sidecar.settings import AuthSettings\nfrom . import pages\n"),
    "sidecar/errors.py": ERRORS,
    "sidecar/settings.py": "import tomllib\n",
    "sidecar/validation.py": "import jsonschema\n\nfrom sidecar.errors import ValidationError\n",
    "sidecar/wire/server.py": ("import grpc\nfrom grpc_status import rpc_status\nfrom google.rpc import status_pb2\n"
                               "from context_sidecar_client.v1 import sidecar_pb2\n"
                               "from sidecar.memory import api\nfrom sidecar.telemetry.metrics import Metrics\n"),
    "clients/python/context_sidecar_client/sync.py": ("import grpc\nfrom context_sidecar_client.v1 import sidecar_pb2\n"
                                                      "from context_sidecar_client.calls import retryable\n"),
    "sidecar/bench/run.py": ("from context_sidecar_client import Client, SidecarCallError\n"
                             "from .workload import Sizes\n"
                             "\n\ndef draw():\n    import matplotlib.pyplot\n"),
    "sidecar/storage/databases.py": DATABASES,
    "sidecar/storage/codec.py": "import fastcore\nfrom sidecar.pb.contextsidecar.storage.v1 import records_pb2\n",
    "sidecar/storage/keys.py": "from ..errors import NotFound\nfrom sidecar.telemetry import logs\n",
    "sidecar/telemetry/logs.py": ("import logging\nfrom sidecar.settings import LogSettings\n"
                                  "from ..errors import SidecarError\n"),
    "sidecar/text/fencing.py": "from sidecar.errors import ValidationError\nfrom sidecar.telemetry import metrics\n",
    "sidecar/storage/environment.py": ("import lmdb\nfrom sidecar.telemetry import metrics\n\n\ndef open(env):\n"
                                       "    return env.open_db(b'events')\n"),
    "sidecar/telemetry/__init__.py": "",
    "sidecar/telemetry/metrics.py": ("import prometheus_client\nfrom sidecar.settings import MetricsSettings\n"
                                     "from ..errors import SidecarError\nfrom . import tracing\n"),
    "sidecar/telemetry/tracing.py": "",
    "sidecar/memory/__init__.py": "",
    "sidecar/memory/schema.py": "import lmdb\n",
    "sidecar/memory/api.py": ("from sidecar.storage.keys import Txn\nfrom sidecar.text import fencing\n"
                              "from sidecar.tenant_events.log import TenantEventLog\n"
                              "from sidecar.telemetry import metrics\n"
                              "from . import schema\nfrom sidecar.errors import SidecarError\n\n\n"
                              "class Forgotten(SidecarError):\n    code = 'forgotten'\n    status = 'NOT_FOUND'\n\n\n"
                              "def read(store, txn):\n    db = store.handles('memory')\n"
                              "    return txn.get(b'k', db=db['mem_docs']), store.handles('memory')['mem_docs']\n"),
    "sidecar/transcript/window.py": ("from ..context_window import sections\n\n\ndef read(self, txn):\n"
                                     "    return txn.get(b'k', db=self._db['windows'])\n"),
    "fastcore/__init__.py": "from fastcore._fastcore import pack\n",
    "fastcore/_fastcore.pyx": "from libc.stdint cimport uint32_t\nimport cython\n",
    "docs/errors.md": "| code | status |\n|---|---|\n| `internal` | INTERNAL |\n| `not_found` | NOT_FOUND |\n"
                      "| `forgotten` | NOT_FOUND |\n",
    "tests/__init__.py": "",
    "tests/helpers.py": "import grpc\nfrom benchmarks._lib.postgres import Postgres\n",
    "tests/conftest.py": "from tests.helpers import TENANT\n",
    "tests/memory/__init__.py": "",
    "tests/memory/test_api.py": "from tests.helpers import TENANT\nfrom ..helpers import ev\n",
    "tests/fastcore/__init__.py": "",
    "tests/plugin/plugin.py": "from sidecar.plugin_api import HookCall\n",
    "benchmarks/__init__.py": "",
    "benchmarks/README.md": BENCH_REGISTRY,
    "benchmarks/_lib/__init__.py": "",
    "benchmarks/_lib/harness.py": "import grpc\nfrom . import corpus\n",
    "benchmarks/bench_turn.py": ("from benchmarks._lib.harness import serving\n"
                                 "from context_sidecar_client import Client\n"),
    "benchmarks/bench_memory.py": "from benchmarks._lib import harness\n",
}
RULES = {"layers": layer_violations, "area order": area_order_violations, "plugins": plugin_violations,
         "lmdb": lmdb_violations, "databases": database_violations, "error classes": error_class_violations,
         "error table": undocumented_errors, "test layout": mirroring_violations,
         "test imports": shared_helpers_violations, "bench registry": benchmark_registry_violations,
         "bench imports": benchmark_import_violations}


def test_a_lawful_tree_breaks_no_rule(tmp_path: Path) -> None:
    root = build(tmp_path, LAWFUL)
    assert {rule: check(root) for rule, check in RULES.items()} == {rule: [] for rule in RULES}


BREAKS = [
    # a. layers
    ("layers", {"sidecar/memory/api.py": "import grpc\n"}, "sidecar/memory/api.py: imports grpc, which only"),
    ("layers", {"sidecar/text/counting.py": "def f():\n    from grpc_status import rpc_status\n"},
     "sidecar/text/counting.py: imports grpc_status, which only sidecar/wire"),
    ("layers", {"sidecar/cli.py": "from google.rpc import status_pb2\n"}, "sidecar/cli.py: imports google.rpc"),
    ("layers", {"sidecar/context_window/state.py": "from context_sidecar_client.v1 import sidecar_pb2 as pb\n"},
     "sidecar/context_window/state.py: imports context_sidecar_client.v1, which only sidecar/wire"),
    ("layers", {"sidecar/storage/environment.py": "from sidecar.pb.contextsidecar.storage.v1 import records_pb2\n"},
     "imports sidecar.pb.contextsidecar.storage.v1, which only sidecar/storage/codec.py may import"),
    ("layers", {"clients/python/context_sidecar_client/calls.py": "from sidecar.errors import SidecarError\n"},
     "clients/python/context_sidecar_client/calls.py: imports sidecar.errors, but the client imports nothing of"),
    ("layers", {"clients/python/context_sidecar_client/aio.py": "def f():\n    import fastcore\n"},
     "clients/python/context_sidecar_client/aio.py: imports fastcore, but the client imports nothing of the server"),
    ("layers", {"sidecar/wire/servicer.py": "from context_sidecar_client import Client\n"},
     "sidecar/wire/servicer.py: imports context_sidecar_client, but nothing of the sidecar imports the client"),
    ("layers", {"sidecar/bench/run.py": "from sidecar.wire.server import serve\n"},
     "sidecar/bench/run.py: imports sidecar.wire.server, but sidecar/bench imports nothing of the sidecar except"),
    ("layers", {"sidecar/bench/report.py": "def f():\n    from sidecar.errors import SidecarError\n"},
     "sidecar/bench/report.py: imports sidecar.errors, but sidecar/bench imports nothing of the sidecar except"),
    ("layers", {"sidecar/bench/run.py": "import grpc\n"},
     "sidecar/bench/run.py: imports grpc, which only sidecar/wire and the client may import"),
    ("layers", {"sidecar/bench/run.py": "from context_sidecar_client.v1 import sidecar_pb2\n"},
     "sidecar/bench/run.py: imports context_sidecar_client.v1, which only sidecar/wire and the client"),
    ("layers", {"sidecar/wire/server.py": "from sidecar.bench.workload import Sizes\n"},
     "sidecar/wire/server.py: imports sidecar.bench.workload, but nothing of the sidecar imports sidecar/bench"),
    ("layers", {"clients/python/context_sidecar_client/sync.py": "from sidecar.bench import report\n"},
     "clients/python/context_sidecar_client/sync.py: imports sidecar.bench, but the client imports nothing of"),
    ("layers", {"sidecar/transcript/log.py": "from sidecar.wire import status\n"},
     "sidecar/transcript/log.py: imports sidecar.wire, but the area layer may not import the wire layer"),
    ("layers", {"sidecar/tenant_events/log.py": "import sidecar.cli\n"}, "the area layer may not import the entry"),
    ("layers", {"sidecar/inspector/server.py": "from sidecar.wire.auth import TenantOf\n"},
     "sidecar/inspector/server.py: imports sidecar.wire.auth, but the inspector layer may not import the wire layer"),
    ("layers", {"sidecar/inspector/pages.py": "import grpc\n"},
     "sidecar/inspector/pages.py: imports grpc, which only sidecar/wire and the client may import"),
    ("layers", {"sidecar/transcript/runs.py": "from sidecar.inspector import pages\n"},
     "sidecar/transcript/runs.py: imports sidecar.inspector, but the area layer may not import the inspector layer"),
    ("layers", {"sidecar/wire/servicer.py": "from sidecar.inspector.server import Inspector\n"},
     "sidecar/wire/servicer.py: imports sidecar.inspector.server, but the wire layer may not import the inspector"),
    ("layers", {"sidecar/storage/keys.py": "from sidecar.memory.api import Memories\n"},
     "sidecar/storage/keys.py: imports sidecar.memory.api, but the storage layer may not import the area layer"),
    ("layers", {"sidecar/storage/keys.py": "from ..text import counting\n"},
     "sidecar/storage/keys.py: imports sidecar.text, but the storage layer may not import the text layer"),
    ("layers", {"sidecar/storage/keys.py": "from sidecar.wire.status import to_status\n"},
     "the storage layer may not import the wire layer"),
    ("layers", {"sidecar/text/fencing.py": "from sidecar.storage.keys import Txn\n"},
     "sidecar/text/fencing.py: imports sidecar.storage.keys, but the text layer may not import the storage layer"),
    ("layers", {"sidecar/text/fencing.py": "from sidecar.transcript import log\n"},
     "the text layer may not import the area layer"),
    ("layers", {"sidecar/validation.py": "from sidecar.text.counting import Counters\n"},
     "sidecar/validation.py: imports sidecar.text.counting, but errors, settings, validation and caching "
     "import nothing"),
    ("layers", {"sidecar/errors.py": ERRORS + "from sidecar.settings import Settings\n"},
     "sidecar/errors.py: imports sidecar.settings, but errors, settings, validation and caching import nothing"),
    ("layers", {"fastcore/_reference.py": "from sidecar.errors import ValidationError\n"},
     "fastcore/_reference.py: imports sidecar.errors, but fastcore takes plain values"),
    ("layers", {"fastcore/_search.pyx": "from libc.stdint cimport uint32_t\nimport lmdb\n"},
     "fastcore/_search.pyx: imports lmdb, but fastcore takes plain values"),
    ("layers", {"fastcore/_matcher.pyx": "from google.protobuf cimport message\n"},
     "fastcore/_matcher.pyx: imports google.protobuf, but fastcore"),
    ("layers", {"sidecar/telemetry/logs.py": "from sidecar.wire.status import to_status\n"},
     "sidecar/telemetry/logs.py: imports sidecar.wire.status, but sidecar/telemetry imports nothing of the sidecar"),
    ("layers", {"sidecar/telemetry/logs.py": "from sidecar.validation import check_id\n"},
     "sidecar/telemetry/logs.py: imports sidecar.validation, but sidecar/telemetry imports nothing"),
    ("layers", {"sidecar/telemetry/logs.py": "import grpc\n"},
     "sidecar/telemetry/logs.py: imports grpc, which only sidecar/wire and the client may import"),
    ("layers", {"sidecar/telemetry/metrics.py": "from sidecar.storage.environment import Store\n"},
     "sidecar/telemetry/metrics.py: imports sidecar.storage.environment, but sidecar/telemetry imports nothing of"),
    ("layers", {"sidecar/telemetry/metrics.py": "from ..validation import check_id\n"},
     "sidecar/telemetry/metrics.py: imports sidecar.validation, but sidecar/telemetry imports nothing of the"),
    ("layers", {"sidecar/telemetry/tracing.py": "import grpc\n"},
     "sidecar/telemetry/tracing.py: imports grpc, which only sidecar/wire and the client may import"),
    ("layers", {"sidecar/telemetry/metrics.py": "from context_sidecar_client import Client\n"},
     "sidecar/telemetry/metrics.py: imports context_sidecar_client, but nothing of the sidecar imports the client"),
    # a2. the areas' order
    ("area order", {"sidecar/context_window/state.py": "from sidecar.transcript.schema import window_at\n"},
     "sidecar/context_window/state.py: imports sidecar.transcript.schema, but the area context_window imports only "
     "areas below it (none)"),
    ("area order", {"sidecar/context_window/profiles.py": "def f():\n    from ..transcript import log\n"},
     "sidecar/context_window/profiles.py: imports sidecar.transcript, but the area context_window"),
    ("area order", {"sidecar/tenant_events/log.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                                                     "    from sidecar.memory.api import Memories\n"},
     "sidecar/tenant_events/log.py: imports sidecar.memory.api, but the area tenant_events imports only"),
    ("area order", {"sidecar/memory/index.py": "from sidecar.transcript.runs import Run\n"},
     "sidecar/memory/index.py: imports sidecar.transcript.runs, but the area memory imports only areas below it "
     "(context_window, tenant_events)"),
    ("area order", {"sidecar/context_window/sections.py": "import sidecar.tenant_events.log\n"},
     "sidecar/context_window/sections.py: imports sidecar.tenant_events.log, but the area context_window"),
    ("plugins", {"tests/plugin/plugin.py": "from sidecar.context_window.policy import HookCall\n"},
     "tests/plugin/plugin.py: imports sidecar.context_window.policy; a plugin may import only sidecar.plugin_api"),
    # b. lmdb
    ("lmdb", {"sidecar/context_window/state.py": "import lmdb\n"},
     "sidecar/context_window/state.py: imports lmdb; only sidecar/storage"),
    ("lmdb", {"sidecar/cli.py": "def main():\n    import lmdb\n"}, "sidecar/cli.py: imports lmdb"),
    ("lmdb", {"sidecar/wire/schema.py": "import lmdb.cffi\n"}, "sidecar/wire/schema.py: imports lmdb"),
    # c. databases
    ("databases", {"sidecar/storage/databases.py": DATABASES.replace('(b"usage",)', '(b"usage", b"events")')},
     "sidecar/storage/databases.py: database events is in 2 areas (runs, run_context)"),
    ("databases", {"sidecar/memory/api.py": "def f(store):\n    return store.env.open_db(b'mem_docs')\n"},
     "sidecar/memory/api.py:2: calls open_db; only sidecar/storage/environment.py opens databases"),
    ("databases", {"sidecar/context_window/state.py": "def f(txn, db):\n    return txn.get(b'k', db=db['windows'])\n"},
     "sidecar/context_window/state.py:2: names database windows of area runs; its own area is run_context"),
    ("databases", {"sidecar/transcript/forks.py": "def f(self):\n    return self._db['usage']\n"},
     "sidecar/transcript/forks.py:2: names database usage of area run_context; its own area is runs"),
    ("databases", {"sidecar/memory/api.py": "def f(store):\n    return store.handles('memory')['events']\n"},
     "sidecar/memory/api.py:2: names database events of area runs; its own area is memory"),
    ("databases", {"sidecar/memory/api.py": "def f(store):\n    return store.handles('memory', 'runs')\n"},
     "sidecar/memory/api.py:2: asks for the handles of area runs; its own area is memory"),
    ("databases", {"sidecar/memory/api.py": "def f(self):\n    return self._db['mem_gone']\n"},
     "sidecar/memory/api.py:2: names database mem_gone, which no area declares"),
    ("databases", {"sidecar/wire/servicer.py": "def f(store):\n    return store.db['events']\n"},
     "sidecar/wire/servicer.py:2: names database events of area runs outside that area"),
    # d. the error table
    ("error classes", {"sidecar/errors.py": ERRORS + "\n\nclass Missing(NotFound):\n    status = 'NOT_FOUND'\n"},
     "Missing has the code 'not_found' and status NOT_FOUND of NotFound"),
    ("error classes", {"sidecar/errors.py": ERRORS + "\n\nclass Blank(SidecarError):\n    code = ''\n"},
     "Blank has no code"),
    ("error classes", {"sidecar/memory/api.py": "from sidecar import errors\n\n\nclass Teapot(errors.NotFound):\n"
                                                "    code = 'forgotten'\n    status = 'IM_A_TEAPOT'\n"},
     "sidecar/memory/api.py:4: Teapot has the status 'IM_A_TEAPOT', which is no grpc.StatusCode"),
    ("error table", {"docs/errors.md": "| code |\n|---|\n| `internal` |\n| `forgotten` |\nnot_found is not a row\n"},
     "sidecar/errors.py:7: NotFound's code 'not_found' has no row in docs/errors.md"),
    ("error table", {"docs/errors.md": None}, "docs/errors.md is missing"),
    # e. the tests
    ("test layout", {"tests/storage_tests/test_keys.py": ""}, "tests/storage_tests: names no folder of sidecar/"),
    ("test layout", {"tests/fastcore/unknown/test_x.py": ""}, "tests/fastcore/unknown: names no folder"),
    ("test layout", {"tests/wire/test_server.py": "", "sidecar/wire/server.py": ""}, "tests/wire: has no __init__.py"),
    ("test imports", {"tests/memory/test_trust.py": "from tests.memory.test_api import TOKENS\n"},
     "tests/memory/test_trust.py: imports tests.memory.test_api; tests share only tests.helpers"),
    ("test imports", {"tests/memory/test_trust.py": "from tests.conftest import TENANT\n"},
     "imports tests.conftest; tests share only tests.helpers"),
    ("test imports", {"tests/memory/test_trust.py": "from .test_api import TOKENS\n"},
     "tests/memory/test_trust.py: imports tests.memory.test_api"),
    ("test imports", {"tests/helpers.py": "def f():\n    from tests.wire.test_server import ev\n"},
     "tests/helpers.py: imports tests.wire.test_server"),
    # g. the benchmarks
    ("bench registry", {"benchmarks/bench_floors.py": ""},
     "benchmarks/bench_floors.py: no row in benchmarks/README.md"),
    ("bench registry", {"benchmarks/bench_memory.py": None},
     "benchmarks/README.md names bench_memory.py, which does not exist"),
    ("bench registry", {"benchmarks/README.md": BENCH_REGISTRY.replace("bench_turn --smoke", "bench_turn")},
     "bench_turn.py's smoke command is python -m benchmarks.bench_turn ... --smoke"),
    ("bench registry", {"benchmarks/README.md": BENCH_REGISTRY.replace("`python -m benchmarks.bench_memory`",
                                                                       "`python -m benchmarks.bench_turn`")},
     "bench_memory.py's row says what it measures and its command, python -m benchmarks.bench_memory"),
    ("bench registry", {"benchmarks/README.md": BENCH_REGISTRY.replace("| bench |", "| file |")},
     "benchmarks/README.md has no table"),
    ("bench registry", {"benchmarks/README.md": None}, "benchmarks/README.md is missing"),
    ("bench imports", {"benchmarks/bench_turn.py": "from tests.helpers import Postgres\n"},
     "benchmarks/bench_turn.py: imports tests.helpers; the benchmarks import nothing of the tests"),
    ("bench imports", {"benchmarks/_lib/harness.py": "def f():\n    from tests import helpers\n"},
     "benchmarks/_lib/harness.py: imports tests; the benchmarks import nothing"),
    ("bench imports", {"tests/helpers.py": "from benchmarks.bench_turn import main\n"},
     "tests/helpers.py: imports benchmarks.bench_turn; of the benchmarks, the tests import only benchmarks._lib"),
    ("bench imports", {"tests/memory/test_api.py": "from benchmarks import corpus\n"},
     "tests/memory/test_api.py: imports benchmarks; of the benchmarks"),
]


@pytest.mark.parametrize("rule, files, reported", BREAKS,
                         ids=[f"{rule}: {reported.split(': ')[-1][:50]}" for rule, _, reported in BREAKS])
def test_a_tree_that_breaks_a_rule_has_it_reported(tmp_path: Path, rule: str, files: dict[str, str | None],
                                                     reported: str) -> None:
    root = build(tmp_path, {**LAWFUL, **{name: text for name, text in files.items() if text is not None}})
    for name in (name for name, text in files.items() if text is None):
        (root / name).unlink()
    violations = RULES[rule](root)
    assert any(reported in violation for violation in violations), violations
    # The break is this rule's alone: every other rule still holds on the tree.
    assert {other: check(root) for other, check in RULES.items() if other != rule} == {
        other: [] for other in RULES if other != rule}


# The generated stubs and the stored format.

def test_committed_stubs_are_what_the_protos_generate(tmp_path: Path) -> None:
    """All of sidecar/pb (the storage stubs, the shipped copies of the contract, the descriptors with
    comments) and all the client's generated modules (the API stubs, its wire messages, fields.py)."""
    subprocess.run([sys.executable, str(ROOT / "scripts" / "generate_stubs.py"), "--out", str(tmp_path)], check=True)
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert {Path("sidecar/pb", name) for name in ("contextsidecar/v1/sidecar.proto", "google/rpc/status.proto",
                                                  "google/rpc/error_details.proto",
                                                  "contextsidecar/v1/sidecar_descriptors.binpb")} <= set(generated)
    client = ROOT / "clients" / "python" / CLIENT
    assert {client / name for name in ("v1/sidecar_pb2.py", "v1/sidecar_pb2_grpc.py", "wire_pb2.py", "fields.py")
            } <= {ROOT / name for name in generated}
    committed = sorted(p.relative_to(ROOT) for p in [*(ROOT / "sidecar" / "pb").rglob("*"), *client.rglob("*_pb2*"),
                                                     client / "fields.py"]
                       if p.is_file() and p.name != "__init__.py" and "__pycache__" not in p.parts)
    assert generated == committed
    for relative in generated:
        assert (tmp_path / relative).read_bytes() == (ROOT / relative).read_bytes(), (
            f"{relative} is stale: run python scripts/generate_stubs.py")


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


def test_the_readme_stays_a_front_door() -> None:
    """At most 8,000 characters: what it is, the two commands, a turn, the guarantees, the speed,
    the map; reference material belongs on a docs/ page."""
    assert len((ROOT / "README.md").read_text(encoding="utf-8")) <= 8000


# The byte layouts: the compiled modules and their twins say what schema.py and NewEvent say.

def test_the_compiled_modules_read_the_layouts_as_declared() -> None:
    assert layout_violations(ROOT) == []
    # The rule reads what runs: the constants it reads are the imported ones.
    import fastcore
    from fastcore import _entries_reference
    from sidecar.transcript import schema
    from sidecar.transcript.log import NewEvent
    assert enum_members(ROOT, "fastcore/_fastcore.pyx")["_RECORD_SIZE"] == fastcore.RECORD_SIZE == schema.RECORD_SIZE
    assert literals(ROOT, "sidecar/transcript/log.py")["NewEvent._fields"] == NewEvent._fields
    assert enum_members(ROOT, "fastcore/_entries.pyx")["EVENT_RULES"] == fastcore.EVENT_RULES == \
        _entries_reference.EVENT_RULES


@pytest.mark.parametrize("relative, old, new, reported", [
    ("fastcore/_entries.pyx", "_RECORD_SIZE = 12", "_RECORD_SIZE = 16", "fastcore/_entries.pyx: _RECORD_SIZE is 16"),
    ("fastcore/_fastcore.pyx", "_GROUP_FIRST_AT = 8", "_GROUP_FIRST_AT = 4",
     "fastcore/_fastcore.pyx: _GROUP_FIRST_AT is 4"),
    ("fastcore/_entries.pyx", "_TYPE = 3", "_TYPE = 4", "fastcore/_entries.pyx: _TYPE is 4"),
    ("fastcore/_entries.pyx", "_RULE_ROLE = 1 << 4", "_RULE_ROLE = 1 << 5", "_RULE_ROLE is 32"),
    ("sidecar/transcript/schema.py", 'struct.Struct("<III")', 'struct.Struct("<IIQ")',
     "fastcore/_fastcore.pyx: _RECORD_SIZE is 12, but the layout it reads says 16"),
    ("sidecar/transcript/schema.py", "= 0, 4, 8", "= 8, 4, 0", "fastcore/_entries.pyx: _TOKENS_AT is 0"),
    ("sidecar/transcript/log.py", "    role: str\n    type: str\n", "    type: str\n    role: str\n",
     "fastcore/_entries.pyx: _ROLE is 2, but the layout it reads says 3"),
    ("fastcore/_entries_reference.py", '"iteration", "iteration_turn"', '"iteration_turn", "iteration"',
     "fastcore/_entries.pyx: _RULE_ITERATION is 4, but the layout it reads says 8"),
    ("fastcore/_fastcore_reference.py", 'struct.Struct("<III")', 'struct.Struct("<IIH")',
     "fastcore/_fastcore_reference.py: _RECORD is '<IIH'"),
])
def test_a_layout_constant_changed_on_one_side_is_reported(tmp_path: Path, relative: str, old: str, new: str,
                                                           reported: str) -> None:
    root = build(tmp_path, {name: (ROOT / name).read_text(encoding="utf-8") for name in LAYOUT_FILES})
    assert layout_violations(root) == []
    text = (root / relative).read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    (root / relative).write_text(text.replace(old, new), encoding="utf-8")
    violations = layout_violations(root)
    assert any(reported in violation for violation in violations), violations
