"""``context-sidecar`` (or ``python -m sidecar``): the command line."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from sidecar.settings import CONFIG_ENV, ConfigError, env_name, flag_name, load_settings, option_fields


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
    return parser


def _section_and_key(dest: str) -> tuple[str, str]:
    """A setting flag's dest is "<section>.<key>"; a section may hold a dot ("memory.compaction")."""
    section, _, key = dest.rpartition(".")
    return section, key


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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
