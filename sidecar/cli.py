"""``context-sidecar`` (or ``python -m sidecar``): the command line."""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from sidecar.settings import CONFIG_ENV, ConfigError, env_name, flag_name, load_settings, option_fields

# The contract as the package ships it (scripts/generate_stubs.py copies it there): the include
# root of contextsidecar/v1/sidecar.proto and of the google/rpc files that decode its errors.
CONTRACT_ROOT = Path(__file__).resolve().parent / "pb"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="context-sidecar",
        description="A gRPC sidecar that counts tokens and assembles each agent turn's context "
                    "under a token budget, over an embedded LMDB store.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve", help="run the sidecar until SIGTERM",
        description="Run the sidecar until SIGTERM or SIGINT. Each setting below can also come from "
                    "a TOML file (--config) or an environment variable CONTEXT_SIDECAR_<SECTION>_<KEY>; "
                    "flags win over the environment, which wins over the file.")
    serve.add_argument("--config", metavar="FILE", help=f"TOML configuration file (or ${CONFIG_ENV})")
    serve.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                       help="logging threshold; default: INFO")
    for section, option in option_fields():
        kind = bool if isinstance(option.default, bool) else None
        help_text = f"{option.metadata['help']} ([{section}] {option.name}, ${env_name(section, option.name)})"
        serve.add_argument(flag_name(section, option), dest=f"{section}.{option.name}", default=None,
                           help=help_text + f"; default: {option.default!r}",
                           **({"action": argparse.BooleanOptionalAction} if kind is bool else {"metavar": "VALUE"}))
    proto = commands.add_parser(
        "proto", help="print the include root of the API's .proto files, or write them out",
        description="The API this sidecar serves, as its package ships it: contextsidecar/v1/sidecar.proto "
                    "and google/rpc/{status,error_details}.proto (the error details). With no flag, print "
                    "their include root, for protoc -I; google/protobuf/*.proto come with every protoc.")
    proto.add_argument("--write", metavar="DIR", type=Path,
                       help="copy the files under DIR (DIR/contextsidecar/v1/sidecar.proto, DIR/google/rpc/...) "
                            "and print each path written")
    # Listed here for --help; its arguments are its own (sidecar/bench/command.py), read in main().
    commands.add_parser("bench", add_help=False,
                        help="measure a running sidecar with synthetic agent turns (bench --help)")
    return parser


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


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # a host-side tool over sidecar.client: imported only when asked for
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
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides = {_section_and_key(dest): value for dest, value in vars(args).items() if "." in dest}
    try:
        settings = load_settings(args.config, overrides=overrides)
    except ConfigError as error:
        print(f"context-sidecar: configuration error: {error}", file=sys.stderr)
        return 2
    try:
        # The compiled fastcore is imported here, through the domain: no Python fallback exists.
        from sidecar.wire.server import serve
    except ImportError as error:
        print(f"context-sidecar: cannot start: {error}", file=sys.stderr)
        return 3
    from sidecar.storage.environment import StoreError
    from sidecar.text.encodings import EncodingIntegrityError

    try:
        return serve(settings)
    except ConfigError as error:  # found once the domain opens: a plugin or a state schema
        print(f"context-sidecar: configuration error: {error}", file=sys.stderr)
        return 2
    except (EncodingIntegrityError, OSError, StoreError) as error:
        print(f"context-sidecar: cannot start: {error}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
