"""Configuration: file, environment and flags, each error naming the key and its source."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.settings import ConfigError, env_name, load_settings, option_fields
from tests.helpers import ROOT


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "sidecar.toml"
    path.write_text(text)
    return str(path)


def test_defaults_are_loopback_and_durable() -> None:
    settings = load_settings(env={})
    assert settings.server.listen == "127.0.0.1:50051"
    assert settings.storage.sync is True
    assert settings.context.token_counter == "o200k_base"


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    config = write(tmp_path, """
[server]
listen = "unix:///tmp/sidecar.sock"
[storage]
map_size = "64MiB"
sync = false
[context]
transcript_token_budget = 8000
token_counter = "chars"
""")
    settings = load_settings(config, env={"CONTEXT_SIDECAR_CONTEXT_TRANSCRIPT_TOKEN_BUDGET": "4000"},
                             overrides={("context", "token_counter"): "cl100k_base",
                                        ("context", "keep_last_turns"): None})
    assert settings.server.listen == "unix:///tmp/sidecar.sock"
    assert settings.storage.map_size == 64 << 20
    assert settings.storage.sync is False
    assert settings.context.transcript_token_budget == 4000  # environment beats the file
    assert settings.context.token_counter == "cl100k_base"  # a flag beats both
    assert settings.context.keep_last_turns == 3  # an absent flag hides nothing


def test_nested_sections_from_file_environment_and_flags(tmp_path: Path) -> None:
    config = write(tmp_path, "[memory]\nembeddings = false\n[memory.compaction]\nenabled = true\nmin_entries = 10\n")
    settings = load_settings(config, env={"CONTEXT_SIDECAR_MEMORY_COMPACTION_KEEP_RECENT": "5"},
                             overrides={("memory.compaction", "token_budget"): "300"})
    compaction = settings.memory_compaction
    assert (compaction.enabled, compaction.min_entries, compaction.keep_recent, compaction.token_budget) == (
        True, 10, 5, 300)
    assert settings.memory.embeddings is False
    with pytest.raises(ConfigError, match="unknown key \\[memory.compaction\\] often"):
        load_settings(write(tmp_path, "[memory.compaction]\noften = 1\n"), env={})


def test_drain_seconds_is_still_read_under_its_former_name(tmp_path: Path) -> None:
    """[server] grace_seconds became drain_seconds: a file or environment written for the old
    name keeps its value (the flag --grace-seconds: tests/test_process.py's first SIGTERM test)."""
    assert load_settings(write(tmp_path, "[server]\ngrace_seconds = 3.5\n"), env={}).server.drain_seconds == 3.5
    assert load_settings(env={"CONTEXT_SIDECAR_SERVER_GRACE_SECONDS": "4"}).server.drain_seconds == 4.0
    assert load_settings(write(tmp_path, "[server]\ndrain_seconds = 2\n"), env={}).server.drain_seconds == 2.0
    with pytest.raises(ConfigError, match="\\[server\\] drain_seconds \\(from .*sidecar.toml\\): must be at least"):
        load_settings(write(tmp_path, "[server]\ngrace_seconds = -1\n"), env={})


def test_the_console_exporter_and_an_otlp_endpoint_are_not_both_taken() -> None:
    with pytest.raises(ConfigError, match="\\[tracing\\] otlp_endpoint: set while \\[tracing\\] exporter is console"):
        load_settings(env={"CONTEXT_SIDECAR_TRACING_EXPORTER": "console",
                           "CONTEXT_SIDECAR_TRACING_OTLP_ENDPOINT": "http://127.0.0.1:4317"})
    with pytest.raises(ConfigError, match="\\[tracing\\] exporter \\(from CONTEXT_SIDECAR_TRACING_EXPORTER\\)"):
        load_settings(env={"CONTEXT_SIDECAR_TRACING_EXPORTER": "stdout"})


def test_config_path_from_the_environment(tmp_path: Path) -> None:
    config = write(tmp_path, "[context]\ntranscript_window = 50\n")
    assert load_settings(env={"CONTEXT_SIDECAR_CONFIG": config}).context.transcript_window == 50


@pytest.mark.parametrize("text, expected", [
    ("[context]\ntranscript_token_budget = 0\n", "[context] transcript_token_budget"),
    ("[context]\ntoken_counter = \"p50k\"\n", "[context] token_counter"),
    ("[context]\nunknown_key = 1\n", "unknown key [context] unknown_key"),
    ("[nonsense]\nx = 1\n", "unknown section [nonsense]"),
    ("[storage]\nsync = \"maybe\"\n", "[storage] sync"),
    ("[storage]\nmap_size = \"lots\"\n", "[storage] map_size"),
    ("[storage]\nmap_size = \"1GiB\"\nmax_map_size = \"512MiB\"\n", "[storage] max_map_size"),
    ("[server]\nlisten = \"0.0.0.0:50051\"\n", "[server] listen"),
    ("[server]\nlisten = \"localhost\"\n", "[server] listen"),
    ("[context\n", "not valid TOML"),
    ("[context]\ncompaction_fraction = 1.5\n", "[context] compaction_fraction"),
    ("[context]\nsummariser = \"llm\"\n", "[context] summariser"),
    ("[context]\nsummarization_strategy = \"sliding\"\n", "[context] summarization_strategy"),
    ("[inspector]\nlisten = \"0.0.0.0:7070\"\n", "[inspector] listen: the inspector listens on loopback only"),
    ("[inspector]\nlisten = \"unix:\"\n", "[inspector] listen: 'unix:' names no socket path"),
    ("[inspector]\nturns_per_page = 0\n", "[inspector] turns_per_page (from "),
    ("[inspector]\nturns_per_page = 1001\n", "must be at most 1000, got 1001"),
    ("[inspector]\ncached_input_usd_per_mtok = -0.1\n", "[inspector] cached_input_usd_per_mtok"),
])
def test_bad_file_values_name_the_key(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(write(tmp_path, text), env={})
    assert expected in str(raised.value)


def test_bad_environment_value_names_the_variable() -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(env={"CONTEXT_SIDECAR_CONTEXT_KEEP_LAST_TURNS": "-1"})
    assert "[context] keep_last_turns" in str(raised.value)
    assert "CONTEXT_SIDECAR_CONTEXT_KEEP_LAST_TURNS" in str(raised.value)


def test_unknown_environment_variable_is_an_error() -> None:
    with pytest.raises(ConfigError, match="CONTEXT_SIDECAR_CONTEXT_BUDGET names no setting"):
        load_settings(env={"CONTEXT_SIDECAR_CONTEXT_BUDGET": "1"})


TENANTS = """
[[auth.tenants]]
id = "acme"
token_sha256 = "%s"
""" % ("a" * 64)


def test_non_loopback_needs_tls_or_insecure_and_tenants(tmp_path: Path) -> None:
    env = {"CONTEXT_SIDECAR_SERVER_LISTEN": "0.0.0.0:50051"}
    with pytest.raises(ConfigError, match="\\[server\\] listen: '0.0.0.0:50051' is not a loopback address.*"
                                          "\\[server.tls\\] cert_file and key_file.*\\[server\\] insecure = true"):
        load_settings(write(tmp_path, TENANTS), env=env)
    tls = {"CONTEXT_SIDECAR_SERVER_TLS_CERT_FILE": "server.pem", "CONTEXT_SIDECAR_SERVER_TLS_KEY_FILE": "server.key"}
    for allowance in ({"CONTEXT_SIDECAR_SERVER_INSECURE": "true"}, tls):
        with pytest.raises(ConfigError, match="auth.tenants"):  # bearer tokens name the tenant, TLS or not
            load_settings(env=env | allowance)
        settings = load_settings(write(tmp_path, TENANTS), env=env | allowance)
        assert settings.server.listen == "0.0.0.0:50051"
        assert settings.server.insecure is ("CONTEXT_SIDECAR_SERVER_INSECURE" in allowance)
        assert [(t.tenant_id, t.token_sha256) for t in settings.auth.tenants] == [("acme", "a" * 64)]


def test_insecure_is_still_read_under_its_former_name(tmp_path: Path) -> None:
    """[server] allow_non_loopback became insecure: a file, variable or flag written for the old
    name keeps its value ([metrics] allow_non_loopback is another setting, unchanged)."""
    listen = {"CONTEXT_SIDECAR_SERVER_LISTEN": "0.0.0.0:50051"}
    config = write(tmp_path, "[server]\nallow_non_loopback = true\n" + TENANTS)
    assert load_settings(config, env=listen).server.insecure is True
    assert load_settings(write(tmp_path, TENANTS), env=listen | {
        "CONTEXT_SIDECAR_SERVER_ALLOW_NON_LOOPBACK": "1"}).server.insecure is True
    assert load_settings(env={}).server.insecure is False
    assert load_settings(env={"CONTEXT_SIDECAR_METRICS_ALLOW_NON_LOOPBACK": "1"}).metrics.allow_non_loopback is True


@pytest.mark.parametrize("text, expected", [
    ("[[auth.tenants]]\nid = \"acme\"\n", "needs exactly the keys"),
    ("[[auth.tenants]]\nid = \"a b\"\ntoken_sha256 = \"%s\"\n" % ("a" * 64), "id must be"),
    ("[[auth.tenants]]\nid = \"acme\"\ntoken_sha256 = \"secret\"\n", "token_sha256 must be"),
    (TENANTS + TENANTS.replace("acme", "other"), "share a token_sha256"),
])
def test_bad_tenants_are_named(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_settings(write(tmp_path, text), env={})


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "localhost:50051", "[::1]:50051", "unix:///tmp/s.sock"])
def test_loopback_and_unix_sockets_are_accepted(listen: str) -> None:
    assert load_settings(env={"CONTEXT_SIDECAR_SERVER_LISTEN": listen}).server.listen == listen


def test_the_inspector_is_off_by_default_and_listens_on_loopback_or_a_unix_socket() -> None:
    defaults = load_settings(env={}).inspector
    assert (defaults.listen, defaults.turns_per_page) == ("", 100)
    for listen in ("127.0.0.1:0", "localhost:7070", "[::1]:7070", "unix:/tmp/inspector.sock",
                   "unix:///tmp/inspector.sock", "unix:inspector.sock"):
        assert load_settings(env={"CONTEXT_SIDECAR_INSPECTOR_LISTEN": listen}).inspector.listen == listen


def test_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nowhere.toml"):
        load_settings(str(tmp_path / "nowhere.toml"), env={})


def test_request_caps_come_from_file_environment_and_flags(tmp_path: Path) -> None:
    defaults = load_settings(env={}).context
    assert (defaults.max_request_events, defaults.max_request_bytes) == (10_000, 8 << 20)
    config = write(tmp_path, '[context]\nmax_request_events = 500\nmax_request_bytes = "4MiB"\n')
    from_file = load_settings(config, env={}).context
    assert (from_file.max_request_events, from_file.max_request_bytes) == (500, 4 << 20)
    from_env = load_settings(config, env={"CONTEXT_SIDECAR_CONTEXT_MAX_REQUEST_BYTES": "2MiB"}).context
    assert from_env.max_request_bytes == 2 << 20
    from_flag = load_settings(config, env={}, overrides={("context", "max_request_events"): "7"}).context
    assert from_flag.max_request_events == 7


@pytest.mark.parametrize("values, expected", [
    ({"CONTEXT_SIDECAR_CONTEXT_MAX_REQUEST_EVENTS": "0"}, "max_request_events .*must be at least 1"),
    ({"CONTEXT_SIDECAR_CONTEXT_MAX_REQUEST_BYTES": "1MiB", "CONTEXT_SIDECAR_CONTEXT_MAX_EVENT_BYTES": "2MiB"},
     "max_event_bytes .* exceeds \\[context\\] max_request_bytes"),
    # 60 MiB of content and 10,000 events of ids cannot arrive under a 64 MiB message limit.
    ({"CONTEXT_SIDECAR_CONTEXT_MAX_REQUEST_BYTES": "60MiB"}, "could not be received"),
    ({"CONTEXT_SIDECAR_CONTEXT_MAX_REQUEST_BYTES": "4MiB", "CONTEXT_SIDECAR_SERVER_MAX_MESSAGE_BYTES": "4MiB"},
     "max_message_bytes"),
])
def test_request_caps_that_cannot_hold_are_refused_at_start(values: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_settings(env=values)


def test_every_setting_is_in_the_settings_page() -> None:
    """docs/settings.md is written by hand: each setting's row, with its environment variable, must
    be there (a setting added to settings.py without its row fails here)."""
    page = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    missing = [f"[{section}] {option.name}" for section, option in option_fields()
               if f"`{env_name(section, option.name)}`" not in page]
    assert missing == []
