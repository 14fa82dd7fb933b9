"""``context-sidecar config``: every effective setting, and where each came from (default, file,
environment, flag), through the real command line: what ``serve`` would run with."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from sidecar.settings import option_fields
from tests.helpers import run_cli

TENANT_HASHES = {tenant: hashlib.sha256(f"token-of-{tenant}".encode()).hexdigest() for tenant in ("acme", "globex")}
CONFIG = """
[storage]
sync = false

[context]
transcript_token_budget = 4000
keep_last_turns = 2

[memory.compaction]
min_entries = 10
""" + "".join(f'\n[[auth.tenants]]\nid = "{tenant}"\ntoken_sha256 = "{digest}"\n'
              for tenant, digest in TENANT_HASHES.items())
ENV = {"CONTEXT_SIDECAR_CONTEXT_TRANSCRIPT_TOKEN_BUDGET": "5000",  # over the file's 4000
       "CONTEXT_SIDECAR_CONTEXT_KEEP_LAST_TURNS": "5",  # over the file's 2, under the flag's 7
       "CONTEXT_SIDECAR_MEMORY_TOKEN_COUNTER": "chars"}
FLAGS = ("--keep-last-turns", "7", "--log-format", "json", "--no-clearing-enabled", "--log-level", "DEBUG")


def settings_shown(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> dict[tuple[str, str], dict]:
    result = run_cli(tmp_path, "config", *args, "--json", env=env)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    shown = {(row["section"], row["key"]): row for row in rows}
    assert len(shown) == len(rows) and all(set(row) == {"section", "key", "value", "source"} for row in rows)
    return shown


def test_config_shows_each_setting_with_its_source(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text(CONFIG)
    shown = settings_shown(tmp_path, "--config", str(config), *FLAGS, env=ENV)
    expected = {
        ("context", "token_counter"): ("o200k_base", "default"),
        ("storage", "sync"): (False, f"file {config}"),
        ("memory.compaction", "min_entries"): (10, f"file {config}"),
        ("context", "transcript_token_budget"): (5000, "env CONTEXT_SIDECAR_CONTEXT_TRANSCRIPT_TOKEN_BUDGET"),
        ("memory", "token_counter"): ("chars", "env CONTEXT_SIDECAR_MEMORY_TOKEN_COUNTER"),
        ("context", "keep_last_turns"): (7, "flag --keep-last-turns"),
        ("log", "format"): ("json", "flag --log-format"),
        ("context.clearing", "enabled"): (False, "flag --clearing-enabled"),
        ("log", "level"): ("DEBUG", "flag --log-level"),
        ("auth", "tenants"): ({"count": 2, "ids": ["acme", "globex"]}, f"file {config}"),
        ("context.clearing", "exclude_tools"): ([], "default"),
    }
    assert {key: (shown[key]["value"], shown[key]["source"]) for key in expected} == expected
    # Every setting, once, in the order settings.md lists them; then the log level and the tenants.
    assert list(shown) == [(section, option.name) for section, option in option_fields()] + [
        ("log", "level"), ("auth", "tenants")]
    untouched = set(shown) - set(expected)
    assert {shown[key]["source"] for key in untouched} == {"default"}


def test_the_table_says_the_same_and_no_token_hash(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text(CONFIG)
    result = run_cli(tmp_path, "config", "--config", str(config), *FLAGS, env=ENV)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    table = {tuple(cells[:2]): cells[2:] for cells in (re.split(r"\s{2,}", line, maxsplit=3) for line in lines)}
    assert table[("section", "key")] == ["value", "source"]
    assert table[("context", "keep_last_turns")] == ["7", "flag --keep-last-turns"]
    assert table[("context", "transcript_token_budget")] == [
        "5000", "env CONTEXT_SIDECAR_CONTEXT_TRANSCRIPT_TOKEN_BUDGET"]
    assert table[("storage", "sync")] == ["false", f"file {config}"]
    assert table[("storage", "path")] == ['"./data"', "default"]
    assert table[("auth", "tenants")] == ["2 (acme, globex)", f"file {config}"]
    assert len(lines) == len(option_fields()) + 3
    assert not any(digest in result.stdout for digest in TENANT_HASHES.values())


def test_the_file_named_by_the_environment_and_no_file_at_all(tmp_path: Path) -> None:
    config = tmp_path / "from-env.toml"
    config.write_text('[server]\nlisten = "127.0.0.1:0"\n')
    shown = settings_shown(tmp_path, env={"CONTEXT_SIDECAR_CONFIG": str(config)})
    assert (shown[("server", "listen")]["value"], shown[("server", "listen")]["source"]) == (
        "127.0.0.1:0", f"file {config}")
    plain = settings_shown(tmp_path)
    assert {row["source"] for row in plain.values()} == {"default"}
    assert plain[("auth", "tenants")]["value"] == {"count": 0, "ids": []}
    assert plain[("log", "level")]["value"] == "INFO"


def test_a_bad_setting_is_the_same_error_as_serve_gives(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "config", "--keep-last-turns", "-1")
    assert result.returncode == 2
    assert "[context] keep_last_turns (from command line): must be at least 0" in result.stderr


def test_the_shared_store_password_is_not_shown(tmp_path: Path) -> None:
    for url, shown_as in (("postgresql://sidecar:hunter2-secret@db:5432/fleet", "postgresql://sidecar:***@db:5432/fleet"),
                          ("host=db user=sidecar password=hunter2-secret dbname=fleet",
                           "host=db user=sidecar password=*** dbname=fleet")):
        for args in (("config",), ("config", "--json")):
            result = run_cli(tmp_path, *args, env={"CONTEXT_SIDECAR_STORAGE_SHARED": url})
            assert result.returncode == 0, result.stderr
            assert "hunter2-secret" not in result.stdout
            assert shown_as in result.stdout
