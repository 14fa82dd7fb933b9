"""Synthetic agent turns shaped like real ones, the same for the same seed.

A turn is four events, as an agent loop makes them: the user's message (prose), the assistant's
tool call (a tool's name and its arguments, a JSON object), the tool's result (JSON, code, a
page of prose or a directory listing, as the tool is) and the assistant's answer (prose, now and
then with code). The result's size in tokens follows a chosen distribution (``Sizes``); the other
events vary around fixed medians (``USER_TOKENS``, ``ANSWER_TOKENS``).

The texts tokenize like real ones: prose is sentences over a vocabulary of some hundreds of
words with names, numbers, paths and versions; code has varied identifiers, indentation and
literals; JSON has records of consistent shape with ids, timestamps and amounts. Sizes are
aimed in o200k_base tokens by measured characters per token (the tests hold each kind within
15% of its aim on average); the sidecar counts what was really sent.

The benchmarks' corpus (``corpus_events``, ``corpus_contents``) is here too: the uniform
~200-token events that ``benchmarks/`` load. Their published figures were measured on exactly
these texts, so they stay byte for byte what they were (a test pins their digest).
"""

from __future__ import annotations

import json
import keyword
import math
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from context_sidecar_client import fields

# The four events of a turn, in order: (role, type).
TURN_SHAPE = (("user", "message"), ("assistant", "tool_call"), ("tool", "tool_result"), ("assistant", "message"))
EVENTS_PER_TURN = len(TURN_SHAPE)

# ---------------------------------------------------------------------------------------------
# Sizes: the --result-tokens grammar.

MAX_TOKENS = 100_000  # a drawn size is clamped to 1..MAX_TOKENS
SIZES_GRAMMAR = ("fixed:N (every result N tokens), uniform:A-B (from A to B, evenly), "
                 "lognormal:M[:S] (median M, shape S, default 1.0: mostly near M with a long tail)")
_SIZES = re.compile(r"(?:(fixed):(\d+)|(uniform):(\d+)-(\d+)|(lognormal):(\d+)(?::(\d+(?:\.\d+)?))?)\Z")


@dataclass(frozen=True)
class Sizes:
    """A distribution of sizes in tokens: ``Sizes.parse("lognormal:300")``."""

    kind: str
    low: int
    high: int = 0
    shape: float = 1.0

    @classmethod
    def parse(cls, spec: str) -> Sizes:
        found = _SIZES.match(spec.strip())
        if not found:
            raise ValueError(f"{spec!r} is not a size distribution; one of: {SIZES_GRAMMAR}")
        if found[1]:
            sizes = cls("fixed", int(found[2]))
        elif found[3]:
            sizes = cls("uniform", int(found[4]), int(found[5]))
            if sizes.high < sizes.low:
                raise ValueError(f"{spec!r}: uniform:A-B needs A <= B")
        else:
            sizes = cls("lognormal", int(found[7]), shape=float(found[8] or 1.0))
        if not 1 <= sizes.low <= MAX_TOKENS or sizes.high > MAX_TOKENS:
            raise ValueError(f"{spec!r}: sizes are 1 to {MAX_TOKENS:,} tokens")
        return sizes

    def draw(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            size = self.low
        elif self.kind == "uniform":
            size = rng.randint(self.low, self.high)
        else:
            size = round(self.low * math.exp(rng.gauss(0.0, self.shape)))
        return max(1, min(MAX_TOKENS, size))

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"fixed:{self.low}"
        if self.kind == "uniform":
            return f"uniform:{self.low}-{self.high}"
        return f"lognormal:{self.low}" + (f":{self.shape:g}" if self.shape != 1.0 else "")


USER_TOKENS = Sizes("lognormal", 40, shape=0.6)
ANSWER_TOKENS = Sizes("lognormal", 150, shape=0.6)

# ---------------------------------------------------------------------------------------------
# Words.

_NOUNS = """account address agent amount answer api archive attempt balance batch billing branch
buffer budget bug build bundle cache call carrier cart change channel charge check client cluster
code column comment commit config connection contract cost count coupon customer dashboard data
database date deadline default delivery dependency deployment detail device discount document
domain draft driver email endpoint engine entry environment error event exception export feature
field file filter folder form format function gateway handler header history host image import
incident index input instance integration invoice issue item job key kettle label latency layer
ledger library limit line link list load lock log manager market message method metric migration
model module monitor network node note notice number object offer order output owner package page
parameter partner password payment payload percentage period permission pipeline plan platform
policy pool port price priority process product profile project prompt property provider query
queue quota rate reason receipt record region release report request response result retry
revenue review role route rule run sample schedule schema scope screen script search secret
section server service session setting shipment signal size snapshot source spec stage state
status step storage store stream string subscription summary supplier support system table task
team template tenant test thread ticket timeout token tool total trace transaction transfer
trigger type update upload user value vendor version warehouse warning window worker workflow""".split()
_VERBS = [tuple(verb.split("/")) for verb in """
accept/accepts/accepted add/adds/added allow/allows/allowed apply/applies/applied
archive/archives/archived build/builds/built calculate/calculates/calculated call/calls/called
cancel/cancels/cancelled change/changes/changed check/checks/checked clear/clears/cleared
collect/collects/collected compare/compares/compared confirm/confirms/confirmed copy/copies/copied
create/creates/created debug/debugs/debugged delete/deletes/deleted deliver/delivers/delivered
deploy/deploys/deployed describe/describes/described detect/detects/detected drop/drops/dropped
enable/enables/enabled expect/expects/expected explain/explains/explained export/exports/exported
fail/fails/failed fetch/fetches/fetched find/finds/found fix/fixes/fixed follow/follows/followed
generate/generates/generated handle/handles/handled ignore/ignores/ignored import/imports/imported
include/includes/included keep/keeps/kept list/lists/listed load/loads/loaded lose/loses/lost
measure/measures/measured merge/merges/merged migrate/migrates/migrated miss/misses/missed
move/moves/moved need/needs/needed notice/notices/noticed open/opens/opened parse/parses/parsed
pass/passes/passed process/processes/processed publish/publishes/published read/reads/read
receive/receives/received record/records/recorded reduce/reduces/reduced refund/refunds/refunded
reject/rejects/rejected release/releases/released remove/removes/removed replace/replaces/replaced
report/reports/reported request/requests/requested resolve/resolves/resolved restart/restarts/restarted
retry/retries/retried return/returns/returned review/reviews/reviewed run/runs/ran save/saves/saved
schedule/schedules/scheduled search/searches/searched send/sends/sent ship/ships/shipped
show/shows/showed skip/skips/skipped sort/sorts/sorted split/splits/split start/starts/started
stop/stops/stopped store/stores/stored submit/submits/submitted summarize/summarizes/summarized
support/supports/supported throw/throws/threw track/tracks/tracked trigger/triggers/triggered
update/updates/updated upload/uploads/uploaded use/uses/used validate/validates/validated
verify/verifies/verified wait/waits/waited write/writes/wrote""".split()]
_ADJECTIVES = """active annual automatic available average broken careful cheap clear complete
correct critical current daily damaged default different duplicate early empty entire exact
expensive expired external final first flaky full global good hidden important incorrect
internal invalid large last late latest local long main manual missing monthly new next obvious
old open optional original other partial pending previous primary private public quick rare
recent regional related remote required same secondary separate serious short significant simple
single slow small specific stale standard strict strong successful temporary typical unexpected
unknown unused urgent useful valid weekly whole wrong""".split()
_ADVERBS = """again already always carefully currently directly eventually exactly finally
first instead later likely manually mostly never now often only probably quickly rarely really
recently still usually""".split()
_PREPOSITIONS = """about after against at before behind between by during for from in into near
of on over through to under until with within without""".split()
_DETERMINERS = "the the the a a this that each every our their its one another".split()
_CONNECTORS = ["However,", "Then", "After that,", "Meanwhile,", "In practice,", "For now,", "As a result,",
               "Otherwise,", "In the meantime,", "To be safe,", "If possible,", "So", "Also,", "Still,",
               "On the other hand,", "Once that is done,", "Before the release,", "By default,"]
_NAMES = """Alice Bob Carol Dmitri Elena Farid Grace Hiroshi Ines Jamal Keiko Lars Maya Nadia Omar
Priya Quentin Rosa Sven Tariq Uma Viktor Wen Ximena Yusuf Zoe Acme Globex Initech Umbrella Hooli
Stripe Postgres Kafka Redis Kubernetes Grafana Slack Jira GitHub""".split()
_UNITS = ["ms", "s", "minutes", "hours", "days", "MB", "GB", "%", "requests", "rows", "users", "EUR", "USD"]
_EXTENSIONS = ["py", "ts", "go", "sql", "yaml", "json", "md", "toml", "js", "rs"]
_FOLDERS = ["src", "lib", "app", "services", "internal", "api", "billing", "orders", "auth", "core", "utils",
            "tests", "config", "jobs", "models", "handlers", "workers", "scripts", "docs", "migrations"]


def _snake(rng: random.Random, parts: int = 2) -> str:
    words = [rng.choice(_VERBS)[0]] if rng.random() < 0.5 else []
    words += [rng.choice(_ADJECTIVES + _NOUNS) for _ in range(parts - 1)] + [rng.choice(_NOUNS)]
    name = "_".join(words[:parts + 1])
    return name + "_" if keyword.iskeyword(name) else name  # "import", "return": not a name in code


def _camel(rng: random.Random) -> str:
    first, *rest = _snake(rng).split("_")
    return first + "".join(word.capitalize() for word in rest)


def _path(rng: random.Random) -> str:
    folders = "/".join(rng.choice(_FOLDERS) for _ in range(rng.randint(1, 3)))
    return f"{folders}/{_snake(rng, rng.randint(1, 2))}.{rng.choice(_EXTENSIONS)}"


def _number(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.3:
        return str(rng.randint(2, 99))
    if kind < 0.5:
        return f"{rng.randint(100, 99_999):,}"
    if kind < 0.7:
        return f"{rng.uniform(0.1, 999):.{rng.randint(1, 2)}f}"
    if kind < 0.85:
        return f"{rng.randint(1, 100)} {rng.choice(_UNITS)}"
    return f"v{rng.randint(0, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 12)}"


def _date(rng: random.Random) -> str:
    return f"20{rng.randint(19, 26)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _base36(rng: random.Random, length: int) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(length))


# ---------------------------------------------------------------------------------------------
# Prose.

def _phrase(rng: random.Random) -> str:
    """A noun phrase: "the stale cache", "Priya", "invoice 4,312", "`src/billing/refund.py`"."""
    kind = rng.random()
    if kind < 0.08:
        return rng.choice(_NAMES)
    if kind < 0.13:
        return f"`{rng.choice((_path, _snake, _camel))(rng)}`"
    if kind < 0.18:
        return f"{rng.choice(_NOUNS)} {_number(rng)}"
    adjective = f"{rng.choice(_ADJECTIVES)} " if rng.random() < 0.45 else ""
    noun = rng.choice(_NOUNS)
    if rng.random() < 0.15:
        noun = f"{rng.choice(_NOUNS)} {noun}"
    determiner = rng.choice(_DETERMINERS)
    if determiner in ("the", "our", "their") and rng.random() < 0.3:
        noun = _plural(noun)
    elif determiner == "a" and (adjective or noun)[0] in "aeiou":
        determiner = "an"
    return f"{determiner} {adjective}{noun}"


def _plural(noun: str) -> str:
    if noun.endswith(("s", "sh", "ch", "x")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def _sentence(rng: random.Random) -> str:
    base, third, past = rng.choice(_VERBS)
    subject, thing = _phrase(rng), _phrase(rng)
    where = f" {rng.choice(_PREPOSITIONS)} {_phrase(rng)}" if rng.random() < 0.7 else ""
    adverb = f"{rng.choice(_ADVERBS)} " if rng.random() < 0.25 else ""
    template = rng.randrange(9)
    if template == 0:
        text = f"{subject} {adverb}{past} {thing}{where}"
    elif template == 1:
        text = f"{subject} {adverb}{third} {thing}{where}"
    elif template == 2:
        text = f"we should {adverb}{base} {thing}{where} before {_date(rng)}"
    elif template == 3:
        text = f"{rng.choice(_CONNECTORS)} {subject} {past} {thing}{where}"
    elif template == 4:
        text = f"can you {base} {thing}{where}?"
    elif template == 5:
        text = f"{subject} {past} {thing} because {_phrase(rng)} {rng.choice(_VERBS)[2]} {_phrase(rng)}"
    elif template == 6:
        text = f"it took {_number(rng)} to {base} {thing}{where}, which is {rng.choice(_ADJECTIVES)}"
    elif template == 7:
        text = f"{subject} was {rng.choice(_ADJECTIVES)}, so {_phrase(rng)} {past} {thing}"
    else:
        text = f"if {subject} {third} {thing}, {_phrase(rng)} {rng.choice(_VERBS)[1]} {_phrase(rng)}{where}"
    text = text[0].upper() + text[1:]
    return text if text.endswith("?") else text + ("!" if rng.random() < 0.05 else ".")


def prose(rng: random.Random, tokens: int) -> str:
    """Paragraphs of sentences, about ``tokens`` o200k tokens."""
    goal, paragraphs, sentences, length = tokens * CHARS_PER_TOKEN["prose"], [], [], 0
    while length < goal:
        sentences.append(_sentence(rng))
        length += len(sentences[-1]) + 1
        if len(sentences) >= rng.randint(3, 6):
            paragraphs.append(" ".join(sentences))
            sentences = []
            length += 1
    if sentences:
        paragraphs.append(" ".join(sentences))
    return _trim_words("\n\n".join(paragraphs), goal)


def _trim_words(text: str, goal: float) -> str:
    if len(text) <= goal * 1.1:
        return text
    cut = text.rfind(" ", 0, max(1, int(goal)))
    return (text[:cut] if cut > 0 else text[:max(1, int(goal))]).rstrip(",;:") + "."


def markdown_page(rng: random.Random, tokens: int) -> str:
    """A fetched page: a title, sections with headings, prose and a bulleted list."""
    title = f"# {rng.choice(_ADJECTIVES).capitalize()} {rng.choice(_NOUNS)} {rng.choice(_NOUNS)}s"
    goal, parts = tokens * CHARS_PER_TOKEN["prose"], [title]
    length = len(parts[0])
    while length < goal:
        part = rng.random()
        if part < 0.2 and not parts[-1].startswith("#"):
            parts.append(f"## {rng.choice(_ADJECTIVES).capitalize()} {_plural(rng.choice(_NOUNS))}")
        elif part < 0.35:
            parts.append("\n".join(f"- {_sentence(rng)}" for _ in range(rng.randint(2, 5))))
        else:
            parts.append(" ".join(_sentence(rng) for _ in range(rng.randint(2, 5))))
        length += len(parts[-1]) + 2
    return _trim_words("\n\n".join(parts), goal)


# ---------------------------------------------------------------------------------------------
# Code.

def _expression(rng: random.Random) -> str:
    kind = rng.randrange(6)
    if kind == 0:
        return f"{_snake(rng, 1)}.{_snake(rng, 1)}"
    if kind == 1:
        return f"{_snake(rng)}({_snake(rng, 1)}, {rng.choice(['None', 'True', str(rng.randint(0, 500))])})"
    if kind == 2:
        return f'"{rng.choice(_NOUNS)} {rng.choice(_VERBS)[2]}: {{}}".format({_snake(rng, 1)})'
    if kind == 3:
        return f"len({_snake(rng, 1)}) {rng.choice(['>', '<', '>=', '=='])} {rng.randint(0, 100)}"
    if kind == 4:
        return f"[{_snake(rng, 1)} for {_snake(rng, 0)} in {_snake(rng, 1)} if {_snake(rng, 0)}.{_snake(rng, 0)}]"
    return f"{_snake(rng, 1)}.get({json.dumps(rng.choice(_NOUNS))}, {rng.randint(0, 60)})"


def _python_function(rng: random.Random) -> str:
    """A function that compiles: every block holds a statement, break and continue only in loops."""
    name = _snake(rng)
    arguments = ", ".join(dict.fromkeys(_snake(rng, 1) for _ in range(rng.randint(1, 4))))
    lines = [f"def {name}({arguments}):", f'    """{_sentence(rng)}"""']
    blocks: list[list[Any]] = []  # the open if/for blocks: [kind, statements in it so far]

    def add(line: str) -> None:
        lines.append("    " * (len(blocks) + 1) + line)
        if blocks:
            blocks[-1][1] += 1

    for _ in range(rng.randint(4, 12)):
        statement = rng.randrange(7)
        if statement in (0, 1) and len(blocks) < 2:
            add(f"if {_expression(rng)}:" if statement == 0 else f"for {_snake(rng, 0)} in {_snake(rng, 1)}:")
            blocks.append(["if" if statement == 0 else "for", 0])
        elif statement == 2:
            lines.append("    " * (len(blocks) + 1) + f"# {_sentence(rng).rstrip('.!').lower()}")
        elif statement == 3 and blocks and blocks[-1][1]:
            in_loop = any(kind == "for" for kind, _ in blocks)
            add(rng.choice(["continue", "break", "return None"] if in_loop else ["return None", "pass"]))
            blocks.pop()
        elif statement == 4:
            add(f"log.{rng.choice(['info', 'debug', 'warning'])}(\"{rng.choice(_VERBS)[2]} %s "
                f"{_plural(rng.choice(_NOUNS))}\", {_snake(rng, 1)})")
        else:
            add(f"{_snake(rng, 1)} = {_expression(rng)}")
            if blocks and rng.random() < 0.25:
                blocks.pop()
    while blocks:
        if not blocks[-1][1]:
            add("pass")
        blocks.pop()
    lines.append(f"    return {_snake(rng, 1)}")
    return "\n".join(lines) + "\n"


def _typescript_function(rng: random.Random) -> str:
    name, argument = _camel(rng), _camel(rng)
    lines = [f"export async function {name}({argument}: {rng.choice(_NOUNS).capitalize()}Input): "
             f"Promise<{rng.choice(_NOUNS).capitalize()}[]> {{"]
    for _ in range(rng.randint(3, 9)):
        statement = rng.randrange(5)
        if statement == 0:
            lines.append(f"  const {_camel(rng)} = await client.{rng.choice(['get', 'post', 'put'])}("
                         f"`/v{rng.randint(1, 3)}/{rng.choice(_NOUNS)}s/${{{argument}.id}}`);")
        elif statement == 1:
            lines.append(f"  if (!{_camel(rng)}.ok) throw new Error(`{rng.choice(_NOUNS)} "
                         f"{rng.choice(_VERBS)[2]}: ${{{argument}.status}}`);")
        elif statement == 2:
            lines.append(f"  // {_sentence(rng).rstrip('.').lower()}")
        elif statement == 3:
            lines.append(f"  const {_camel(rng)} = {_camel(rng)}.filter((x) => x.{_camel(rng)} "
                         f"{rng.choice(['>', '!==', '==='])} {rng.randint(0, 99)});")
        else:
            lines.append(f"  {_camel(rng)}.{rng.choice(['push', 'set', 'delete'])}({argument}.{_camel(rng)});")
    lines += [f"  return {_camel(rng)}.map((x) => x.{rng.choice(_NOUNS)});", "}"]
    return "\n".join(lines) + "\n"


def code(rng: random.Random, tokens: int) -> str:
    """Source code, about ``tokens`` tokens: Python with a module header, or TypeScript."""
    goal = tokens * CHARS_PER_TOKEN["code"]
    python = rng.random() < 0.7
    if python:
        header = (f"import {rng.choice(['logging', 'json', 'time', 'os'])}\n"
                  f"from {rng.choice(_FOLDERS)}.{_snake(rng, 1)} import {_camel(rng).capitalize()}\n\n"
                  "log = logging.getLogger(__name__)\n")
    else:
        header = f"import {{ {_camel(rng)} }} from \"../{rng.choice(_FOLDERS)}/{_camel(rng)}\";\n"
    blocks, length = [header], len(header)
    function = _python_function if python else _typescript_function
    while length < goal:  # whole functions while they fit
        block = function(rng)
        if length + len(block) > goal * 1.1:
            break
        blocks.append(block)
        length += len(block) + 1
    misses = 0
    while length < goal * 0.95 and misses < 4:  # then module-level lines up to the aim: still valid code
        line = _module_line(rng, python)
        if length + len(line) > goal * 1.05:
            misses += 1
            continue
        blocks.append(line)
        length += len(line) + 1
    return "\n".join(blocks)


def _module_line(rng: random.Random, python: bool) -> str:
    constant = _snake(rng).upper()
    value = rng.choice([str(rng.randint(0, 10_000)), json.dumps(_sentence(rng)),
                        json.dumps({rng.choice(_NOUNS): rng.randint(0, 99), rng.choice(_KEYS): _date(rng)})])
    if rng.random() < 0.4:
        return f"{'#' if python else '//'} {_sentence(rng)}"
    return f"{constant} = {value}" if python else f"export const {constant} = {value};"


# ---------------------------------------------------------------------------------------------
# JSON.

_STATUSES = ["pending", "paid", "shipped", "delivered", "refunded", "cancelled", "failed", "open", "closed"]


def _field_value(rng: random.Random, key: str) -> Any:
    if key == "id" or key.endswith("_id"):
        return f"{key.split('_')[0][:3]}_{_base36(rng, rng.randint(6, 10))}"
    if key.endswith("_at"):
        return f"{_date(rng)}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z"
    if key in ("amount", "total", "price", "score", "ratio"):
        return round(rng.uniform(0, 5000), 2)
    if key in ("count", "quantity", "attempts", "size", "line"):
        return rng.randint(0, 10_000)
    if key in ("status", "state"):
        return rng.choice(_STATUSES)
    if key in ("active", "verified", "enabled"):
        return rng.random() < 0.5
    if key == "email":
        return f"{rng.choice(_NAMES).lower()}.{rng.choice(_NOUNS)}@example.com"
    if key in ("name", "owner", "assignee"):
        return f"{rng.choice(_NAMES)} {rng.choice(_NAMES)}"
    if key == "tags":
        return rng.sample(_NOUNS, rng.randint(1, 4))
    if key in ("url", "link"):
        return f"https://{rng.choice(_NAMES).lower()}.example.com/{rng.choice(_NOUNS)}s/{rng.randint(1, 99_999)}"
    if key == "path":
        return _path(rng)
    if key == "address":
        return {"street": f"{rng.randint(1, 300)} {rng.choice(_NAMES)} {rng.choice(['Street', 'Road', 'Lane'])}",
                "city": rng.choice(_NAMES) + rng.choice(["ville", "burg", "ton", "field"]),
                "country": rng.choice(["DE", "FR", "US", "JP", "BR", "IN", "NL"])}
    if key == "note" and rng.random() < 0.3:
        return None
    return _sentence(rng)


_KEYS = ["id", "order_id", "customer_id", "created_at", "updated_at", "amount", "total", "price", "score",
         "count", "quantity", "attempts", "status", "state", "active", "verified", "email", "name", "owner",
         "tags", "url", "path", "address", "note", "description", "title", "summary", "reason", "line"]


def json_document(rng: random.Random, tokens: int, indent: bool | None = None) -> str:
    """A tool's JSON answer, about ``tokens`` tokens: records of one shape, with a total and a cursor."""
    goal = tokens * CHARS_PER_TOKEN["json"]
    indent = rng.random() < 0.5 if indent is None else indent
    # Small answers are short records (a row of 8 keys is ~100 tokens), larger ones wider.
    keys = ["id", *rng.sample(_KEYS[1:], min(rng.randint(4, 8), max(1, tokens // 25)))]
    rows: list[dict[str, Any]] = []
    document: dict[str, Any] = {"results": rows, "total": 0, "next_cursor": None}
    text = json.dumps(document)
    while True:
        row = {key: _field_value(rng, key) for key in keys}
        candidate = json.dumps(document | {"results": rows + [row]}, indent=2 if indent else None)
        if rows and len(candidate) > goal * 1.1:
            break
        rows.append(row)
        text = candidate
        if len(text) >= goal:
            break
    document["total"] = len(rows) + rng.randint(0, 500)
    document["next_cursor"] = _base36(rng, 12) if rng.random() < 0.6 else None
    return json.dumps(document, indent=2 if indent else None)


def directory_listing(rng: random.Random, tokens: int) -> str:
    """``ls -l``-like lines of files."""
    goal, length = tokens * CHARS_PER_TOKEN["listing"], 0
    lines: list[str] = []
    while length < goal or not lines:
        lines.append(f"{rng.choice(['-rw-r--r--', '-rwxr-xr-x', 'drwxr-xr-x'])} {rng.randint(1, 999_999):>7} "
                     f"{_date(rng)} {_path(rng)}")
        length += len(lines[-1]) + 1
    return "\n".join(lines)


# Characters per o200k_base token of each kind, measured over many texts (tests/bench hold them).
CHARS_PER_TOKEN = {"prose": 4.9, "code": 4.6, "json": 3.2, "listing": 2.55}

# ---------------------------------------------------------------------------------------------
# Turns.

Event = fields.Event  # an Event message's fields, as the client takes them


class Turn(NamedTuple):
    """One turn: its four events, in TURN_SHAPE's order."""

    user: Event
    call: Event
    result: Event
    answer: Event


def _search_arguments(rng: random.Random) -> dict[str, Any]:
    return {"query": " ".join(rng.choice(_NOUNS + _ADJECTIVES) for _ in range(rng.randint(2, 6))),
            "limit": rng.choice([5, 10, 20, 50])}


def _sql_arguments(rng: random.Random) -> dict[str, Any]:
    table, column = rng.choice(_NOUNS), rng.choice(_KEYS)
    return {"sql": f"SELECT {', '.join(rng.sample(_KEYS, 3))} FROM {table}s WHERE {column} = "
                   f"'{rng.choice(_STATUSES)}' ORDER BY created_at DESC LIMIT {rng.randint(10, 200)}"}


# Each tool: (name, its arguments, its result). The results' kinds are what such tools return.
TOOLS: tuple[tuple[str, Callable[[random.Random], dict[str, Any]], Callable[[random.Random, int], str]], ...] = (
    ("search", _search_arguments, json_document),
    ("read_file", lambda rng: {"path": _path(rng)}, code),
    ("run_sql", _sql_arguments, lambda rng, tokens: json_document(rng, tokens, indent=False)),
    ("fetch_page", lambda rng: {"url": _field_value(rng, "url")}, markdown_page),
    ("list_dir", lambda rng: {"path": rng.choice(_FOLDERS) + "/", "recursive": rng.random() < 0.5},
     directory_listing),
)


def agent_turns(seed: int | str, result_tokens: Sizes, first: int = 1) -> Iterator[Turn]:
    """The turns of one run, endlessly, from iteration ``first``: the same seed, the same turns.
    Event ids are "u<i>", "c<i>", "r<i>", "a<i>" and the call id "k<i>" for iteration i."""
    rng = random.Random(f"context-sidecar bench {seed}")
    for iteration in range(first, 1 << 30):
        name, arguments, result = TOOLS[rng.randrange(len(TOOLS))]
        user = prose(rng, USER_TOKENS.draw(rng))
        if rng.random() < 0.3:
            user = user.rstrip(".!") + "?"
        call = json.dumps(arguments(rng))
        output = result(rng, result_tokens.draw(rng))
        answer_tokens = ANSWER_TOKENS.draw(rng)
        answer = prose(rng, answer_tokens)
        if rng.random() < 0.25:
            answer = (prose(rng, max(1, answer_tokens // 3)) + "\n\n```python\n"
                      + code(rng, max(1, answer_tokens * 2 // 3)) + "```")
        call_id = f"k{iteration}"
        yield Turn(
            {"event_id": f"u{iteration}", "iteration": iteration, "role": "user", "type": "message", "content": user},
            {"event_id": f"c{iteration}", "iteration": iteration, "role": "assistant", "type": "tool_call",
             "call_id": call_id, "tool_name": name, "content": call},
            {"event_id": f"r{iteration}", "iteration": iteration, "role": "tool", "type": "tool_result",
             "call_id": call_id, "content": output},
            {"event_id": f"a{iteration}", "iteration": iteration, "role": "assistant", "type": "message",
             "content": answer})


# ---------------------------------------------------------------------------------------------
# The benchmarks' corpus: uniform ~200-token events over a small vocabulary, byte for byte the
# texts the published figures of benchmarks/ were measured on (do not change them).

CORPUS_WORDS = ("the agent reads the file and calls a tool to search for the refund policy then it summarises "
                "what the customer asked about shipping invoices latency budget context window token cache "
                "prefix replay summary memory tenant error retry timeout result value config index").split()
CORPUS_NAMES = ("user_id", "order", "status", "items", "total", "currency", "created_at", "notes", "tags", "score")
_CORPUS_CODE = [
    "def {name}(items, limit={n}):\n    seen = set()\n    out = []\n    for item in items:\n"
    "        if item.key in seen:\n            continue\n        seen.add(item.key)\n        out.append(item)\n"
    "        if len(out) >= limit:\n            break\n    return out\n",
    "async function {name}(client, id) {{\n  const res = await client.get(`/v1/items/${{id}}?limit={n}`);\n"
    "  if (!res.ok) throw new Error(`status ${{res.status}}`);\n"
    "  return (await res.json()).items.map((x) => x.name);\n}}\n",
    "SELECT o.id, o.total, c.name FROM orders o JOIN customers c ON c.id = o.customer_id\n"
    "WHERE o.created_at > now() - interval '{n} days' AND o.status = '{name}'\nORDER BY o.total DESC LIMIT 50;\n",
]


class CorpusEvent(NamedTuple):
    event_id: str
    iteration: int
    role: str
    type: str
    content: str
    call_id: str


def corpus_prose(rng: random.Random) -> str:
    return " ".join(rng.choice(CORPUS_WORDS) for _ in range(195)).capitalize() + "."


def corpus_json(rng: random.Random) -> str:
    rows = [{name: rng.choice((rng.randrange(10_000), rng.choice(CORPUS_WORDS), rng.random() < 0.5))
             for name in rng.sample(CORPUS_NAMES, 6)} for _ in range(5)]
    return json.dumps({"tool": "search", "ok": True, "rows": rows})


def corpus_code(rng: random.Random) -> str:
    return "".join(rng.choice(_CORPUS_CODE).format(name=rng.choice(CORPUS_WORDS) + "_" + rng.choice(CORPUS_WORDS),
                                                   n=rng.randrange(100)) for _ in range(3))


def corpus_events(count: int, seed: int = 1) -> Iterator[CorpusEvent]:
    """``count`` events of a run in TURN_SHAPE, turn after turn from iteration 1: ids "e<seq>",
    call ids "call-<turn>"; every content ~200 tokens (a tool call's too)."""
    rng = random.Random(seed)
    for seq in range(count):
        turn, step = divmod(seq, EVENTS_PER_TURN)
        role, type_ = TURN_SHAPE[step]
        content = (corpus_prose(rng) if step == 0 else corpus_json(rng) if step == 1
                   else rng.choice((corpus_json, corpus_code))(rng) if step == 2
                   else rng.choice((corpus_prose, corpus_code))(rng))
        yield CorpusEvent(f"e{seq}", turn + 1, role, type_, content, f"call-{turn}" if step in (1, 2) else "")


def corpus_contents(count: int, seed: int) -> list[str]:
    """``count`` more ~200-token texts, for the events a benchmark appends turn by turn."""
    rng = random.Random(seed)
    return [rng.choice((corpus_prose, corpus_json, corpus_code))(rng) for _ in range(count)]
