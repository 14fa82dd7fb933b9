"""``context-sidecar`` (or ``python -m sidecar``): the command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import sidecar
from sidecar.settings import (
    CONFIG_ENV,
    ConfigError,
    Settings,
    env_name,
    flag_name,
    load_settings_and_sources,
    option_fields,
)
from sidecar.telemetry import logs

if TYPE_CHECKING:  # imported when a command runs: the compiled fastcore comes with them
    from sidecar.inspector.server import InspectorServer
    from sidecar.wire.server import Beside, Services

# The contract as the package ships it (scripts/generate_stubs.py copies it there): the include
# root of contextsidecar/v1/sidecar.proto and of the google/rpc files that decode its errors.
CONTRACT_ROOT = Path(__file__).resolve().parent / "pb"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_LEVEL = "INFO"  # --log-level's default
INSPECT_LISTEN = "127.0.0.1:7070"  # where inspect serves when [inspector] listen is not set


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="context-sidecar",
        description="A gRPC sidecar that counts tokens and assembles each agent turn's context "
                    "under a token budget, over an embedded LMDB store.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {sidecar.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve", help="run the sidecar until SIGTERM",
        description="Run the sidecar until SIGTERM or SIGINT. Each setting below can also come from "
                    "a TOML file (--config) or an environment variable CONTEXT_SIDECAR_<SECTION>_<KEY>; "
                    "flags win over the environment, which wins over the file.")
    _add_setting_flags(serve)
    config = commands.add_parser(
        "config", help="print every effective setting and where it came from",
        description="Print each setting serve would run with, given the same flags, environment and file "
                    "(a plugin or state schema is checked only by serve): section, key, value and its source: "
                    "default, file <path>, env CONTEXT_SIDECAR_<SECTION>_<KEY> or flag --<name>. "
                    "[[auth.tenants]]: how many, and their ids.")
    _add_setting_flags(config)
    config.add_argument("--json", action="store_true",
                        help="print one JSON array of {section, key, value, source} objects instead of a table")
    proto = commands.add_parser(
        "proto", help="print the include root of the API's .proto files, or write them out",
        description="The API this sidecar serves, as its package ships it: contextsidecar/v1/sidecar.proto "
                    "and google/rpc/{status,error_details}.proto (the error details). With no flag, print "
                    "their include root, for protoc -I; google/protobuf/*.proto come with every protoc.")
    proto.add_argument("--write", metavar="DIR", type=Path,
                       help="copy the files under DIR (DIR/contextsidecar/v1/sidecar.proto, DIR/google/rpc/...) "
                            "and print each path written")
    inspect = commands.add_parser(
        "inspect", help="serve a local, read-only web page over the store's runs",
        description="Serve the run inspector (docs/inspector.md) over the store serve uses, given the same "
                    "flags, environment and file, until SIGTERM or SIGINT: the runs, each run's turns and "
                    "exactly what each turn fed. Loopback or a unix socket only ([inspector] listen, "
                    f"--inspector-listen; unset: {INSPECT_LISTEN}); with [[auth.tenants]], a tenant's token is "
                    "asked for and only its runs are shown.")
    _add_setting_flags(inspect)
    # Listed here for --help; its arguments are its own (sidecar/bench/command.py), read in main().
    commands.add_parser("bench", add_help=False,
                        help="measure a running sidecar with synthetic agent turns (bench --help)")
    return parser


def _add_setting_flags(command: argparse.ArgumentParser) -> None:
    """--config, --log-level and one flag per setting: what serve runs with, and config shows."""
    command.add_argument("--config", metavar="FILE", help=f"TOML configuration file (or ${CONFIG_ENV})")
    command.add_argument("--log-level", default=None, choices=LOG_LEVELS,
                         help=f"logging threshold; default: {LOG_LEVEL}")
    for section, option in option_fields():
        kind = bool if isinstance(option.default, bool) else None
        help_text = f"{option.metadata['help']} ([{section}] {option.name}, ${env_name(section, option.name)})"
        former = option.metadata["former_name"]  # still accepted
        command.add_argument(flag_name(section, option), *([f"--{former.replace('_', '-')}"] if former else []),
                             dest=f"{section}.{option.name}", default=None,
                             help=help_text + f"; default: {option.default!r}",
                             **({"action": argparse.BooleanOptionalAction} if kind is bool else {"metavar": "VALUE"}))


def write_contract(directory: Path) -> list[Path]:
    written = []
    for source in sorted(CONTRACT_ROOT.rglob("*.proto")):
        target = directory / source.relative_to(CONTRACT_ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        written.append(target)
    return written


def _section_and_key(dest: str) -> tuple[str, str]:
    """A setting flag's dest is "<section>.<key>"; a section may hold a dot ("memory.compaction")."""
    section, _, key = dest.rpartition(".")
    return section, key


def _settings(args: argparse.Namespace) -> tuple[Settings, dict[tuple[str, str], str]]:
    overrides = {_section_and_key(dest): value for dest, value in vars(args).items() if "." in dest}
    return load_settings_and_sources(args.config, overrides=overrides)


def without_password(conninfo: str) -> str:
    """A PostgreSQL URL or key=value conninfo as it may be shown: its password as ``***``."""
    shown = re.sub(r"^(postgres(?:ql)?://[^:@/?#]*:)[^@/?#]*@", r"\1***@", conninfo)
    return re.sub(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", shown)


def config_rows(settings: Settings, sources: dict[tuple[str, str], str], log_level: str | None) -> list[dict]:
    """Each setting's section, key, effective value and source; then the log level (a flag only)
    and the tenants (their count and ids: nothing of their tokens)."""
    rows = []
    for section, option in option_fields():
        value = getattr(getattr(settings, section.replace(".", "_")), option.name)
        if (section, option.name) == ("storage", "shared"):
            value = without_password(value)
        rows.append({"section": section, "key": option.name,
                     "value": list(value) if isinstance(value, tuple) else value,
                     "source": sources[(section, option.name)]})
    rows.append({"section": "log", "key": "level", "value": log_level or LOG_LEVEL,
                 "source": "flag --log-level" if log_level else "default"})
    ids = [tenant.tenant_id for tenant in settings.auth.tenants]
    rows.append({"section": "auth", "key": "tenants", "value": {"count": len(ids), "ids": ids},
                 "source": sources[("auth", "tenants")]})
    return rows


def config_table(rows: list[dict]) -> str:
    """The rows as an aligned table; values as TOML writes them (tenants: their count and ids)."""
    def shown(row: dict) -> str:
        value = row["value"]
        if row["section"] == "auth":
            return f"{value['count']}" + (f" ({', '.join(value['ids'])})" if value["ids"] else "")
        return json.dumps(value)
    lines = [("section", "key", "value", "source"), *((r["section"], r["key"], shown(r), r["source"]) for r in rows)]
    widths = [max(len(line[column]) for line in lines) for column in range(3)]
    return "\n".join("  ".join([*(cell.ljust(width) for cell, width in zip(line, widths)), line[3]])
                     for line in lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # a host-side tool over context_sidecar_client: imported only when asked for
        from sidecar.bench.command import main as bench

        return bench(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "proto":
        try:
            print(*(write_contract(args.write) if args.write else [CONTRACT_ROOT]), sep="\n")
        except OSError as error:
            print(f"context-sidecar: cannot write the contract: {error}", file=sys.stderr)
            return 1
        return 0
    try:
        settings, sources = _settings(args)
    except ConfigError as error:
        print(f"context-sidecar: configuration error: {error}", file=sys.stderr)
        return 2
    if args.command == "config":
        rows = config_rows(settings, sources, args.log_level)
        print(json.dumps(rows, indent=2) if args.json else config_table(rows))
        return 0
    logs.configure(args.log_level or LOG_LEVEL, settings.log.format)
    try:
        # The compiled fastcore is imported here, through the domain: no Python fallback exists.
        from sidecar.wire.server import serve
    except ImportError as error:
        logs.say(f"context-sidecar: cannot start: {error}", sys.stderr, logging.ERROR)
        return 3
    from sidecar.storage.environment import StoreError
    from sidecar.text.encodings import EncodingIntegrityError

    try:
        if args.command == "inspect":
            return inspect(settings)
        exit_at_once(serve(settings, beside=inspector_beside(settings) if settings.inspector.listen else None))
    except ConfigError as error:  # found once the domain opens: a plugin or a state schema
        logs.say(f"context-sidecar: configuration error: {error}", sys.stderr, logging.ERROR)
        return 2
    except (EncodingIntegrityError, OSError, StoreError) as error:
        logs.say(f"context-sidecar: cannot start: {error}", sys.stderr, logging.ERROR)
        return 3


def exit_at_once(code: int) -> NoReturn:
    """Leave as soon as serve has stopped (its log's last line said so): a call still running
    past the drain has been cancelled, but its thread cannot be interrupted, and the interpreter's
    exit would join it (concurrent.futures joins its workers), holding the process for as long
    as the call runs."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _inspector_server(settings: Settings, services: Services, listen: str) -> InspectorServer:
    from sidecar.inspector.server import Inspector, InspectorServer

    return InspectorServer(Inspector(services.transcripts, services.memories, settings.auth, settings.inspector),
                           listen).start()


def inspector_beside(settings: Settings) -> Beside:
    """``[inspector] listen`` served by serve, over the domain its gRPC server serves (the wire
    does not import the inspector: it is wired here)."""
    def start(services: Services) -> tuple[Callable[[], None], Callable[[], None]]:
        server = _inspector_server(settings, services, settings.inspector.listen)
        return lambda: logs.say(f"context-sidecar inspector on {server.url}", url=server.url), server.stop

    return start


def inspect(settings: Settings) -> int:
    """Serve the run inspector over the store until SIGTERM or SIGINT."""
    import signal
    import threading

    from sidecar.wire.server import SIGNAL_POLL_SECONDS, Services

    services = Services.open(settings)
    try:
        server = _inspector_server(settings, services, settings.inspector.listen or INSPECT_LISTEN)
    except BaseException:
        services.close()
        raise

    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stopping.set())
    logs.say(f"context-sidecar inspector on {server.url}", url=server.url)
    # Woken by the clock too, as serve's wait: a signal the kernel hands to one of the page
    # threads only marks the handler pending, and an untimed wait here would never run it.
    while not stopping.wait(SIGNAL_POLL_SECONDS):
        pass
    server.stop()  # the page being served finishes first: the store closes after it
    services.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
