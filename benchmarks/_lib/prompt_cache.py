"""What a provider's prompt cache would bill for a run's requests, recounted from the rendered bodies.

Nothing here asks the sidecar what it expects the cache to do: each request body is parsed back
into the blocks a provider lays out as its prompt, in the provider's order (the tools, then the
system text, then the messages), every block's text counted with tiktoken o200k, and the cache is
modelled from those blocks alone:

- OpenAI (automatic): the longest token prefix shared with the previous request is cached once it
  reaches 1,024 tokens, in 128-token steps, and billed at 0.1 of the input price; the rest at 1.
- Anthropic (``cache_control``): a request reads from the cache the longest prefix that ends at
  one of its breakpoints, or at one of the 20 block boundaries before a breakpoint (the
  provider's lookback), and that an earlier request wrote; that is billed at 0.1. The tokens
  after it up to the last breakpoint are written at 1.25 (a prefix shorter than 1,024 tokens is
  not cached, so not written); the tokens after the last breakpoint are billed at 1. Every
  breakpoint's prefix is then in the cache. Entries expire only when the caller says a pause
  passed the provider's lifetime (``expire``): otherwise a run's turns are assumed to come within
  it (5 minutes), which each read refreshes.

A cache marker is not part of a block's identity: moving a breakpoint does not change the bytes
the provider hashes.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import tiktoken

# Per block, the role and type markers a provider adds around its text (OpenAI documents ~3 per
# message). The same for every policy, so it moves no ratio; it keeps tiny blocks from being free.
FRAMING_TOKENS = 4
OPENAI_MIN_CACHED, OPENAI_STEP = 1024, 128
ANTHROPIC_MIN_CACHEABLE, ANTHROPIC_LOOKBACK = 1024, 20
CACHED_READ, CACHE_WRITE, BASE = 0.1, 1.25, 1.0


@dataclass(frozen=True, slots=True)
class Block:
    kind: str  # where it sits: "tool", "system", "<role>" (a message's first block), "<role>+" (a later one)
    identity: str  # kind and the block's canonical JSON without its cache marker: equal iff the bytes are
    tokens: array  # the o200k tokens of the block's text
    breakpoint: bool  # carries cache_control

    @property
    def size(self) -> int:
        return len(self.tokens) + FRAMING_TOKENS


class TokenCache:
    """o200k tokens of each distinct text, counted once: a run's requests repeat most of their blocks."""

    def __init__(self, encoding: tiktoken.Encoding) -> None:
        self._encode: Callable[[str], list[int]] = encoding.encode_ordinary
        self._tokens: dict[str, array] = {}

    def __call__(self, text: str) -> array:
        tokens = self._tokens.get(text)
        if tokens is None:
            tokens = self._tokens[text] = array("I", self._encode(text))
        return tokens

    def clear(self) -> None:
        self._tokens.clear()


def _canonical(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def _text_of(block: dict) -> str:
    """What the provider reads of a content block: its text, a call's name and arguments, a result's output."""
    kind = block.get("type")
    if kind == "text":
        return block["text"]
    if kind == "tool_use":
        return block["name"] + _canonical(block["input"])
    if kind == "tool_result":
        content = block.get("content", "")
        return content if isinstance(content, str) else "\n".join(part.get("text", "") for part in content)
    return _canonical({key: value for key, value in block.items() if key != "cache_control"})


def _block(kind: str, raw: dict, text: str, tokens: TokenCache) -> Block:
    unmarked = {key: value for key, value in raw.items() if key != "cache_control"}
    return Block(kind, kind + "\0" + _canonical(unmarked), tokens(text), "cache_control" in raw)


def anthropic_blocks(body: str, tokens: TokenCache) -> list[Block]:
    """A Messages request body as the provider's prompt: tools, system blocks, then each message's blocks."""
    document = json.loads(body)
    blocks = [_block("tool", tool, _canonical({k: v for k, v in tool.items() if k != "cache_control"}), tokens)
              for tool in document.get("tools", [])]
    system = document.get("system", [])
    if isinstance(system, str):
        system = [{"type": "text", "text": system}]
    blocks += [_block("system", block, _text_of(block), tokens) for block in system]
    for message in document["messages"]:
        content = message["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        blocks += [_block(message["role"] + ("+" if position else ""), block, _text_of(block), tokens)
                   for position, block in enumerate(content)]
    return blocks


def openai_blocks(body: str, tokens: TokenCache) -> list[Block]:
    """A Responses request body as the provider's prompt: tools, instructions, then the input items."""
    document = json.loads(body)
    blocks = [_block("tool", tool, _canonical(tool), tokens) for tool in document.get("tools", [])]
    if document.get("instructions"):
        blocks.append(_block("system", {"instructions": document["instructions"]}, document["instructions"], tokens))
    for item in document.get("input", []):
        kind = item.get("type", "message")
        if kind == "message":
            content = item["content"]
            text = content if isinstance(content, str) else "\n".join(part.get("text", "") for part in content)
            kind = item["role"]
        elif kind == "function_call":
            text = item["name"] + item["arguments"]
        elif kind == "function_call_output":
            output = item["output"]
            text = output if isinstance(output, str) else "\n".join(part.get("text", "") for part in output)
        else:
            text = _canonical(item)
        blocks.append(_block(kind, item, text, tokens))
    return blocks


def sent_tokens(blocks: Sequence[Block]) -> int:
    return sum(block.size for block in blocks)


def common_prefix_tokens(before: Sequence[Block], after: Sequence[Block]) -> int:
    """The tokens ``after`` begins with that ``before`` began with too: whole equal blocks, then the
    shared start of the first block that differs (its framing too, when it sits in the same place)."""
    shared = 0
    for old, new in zip(before, after):
        if old.identity == new.identity:
            shared += new.size
            continue
        if old.kind == new.kind:
            shared += FRAMING_TOKENS + _shared_start(old.tokens, new.tokens)
        break
    return shared


def _shared_start(first: array, second: array) -> int:
    """How many leading tokens two arrays share, by halving: a slice comparison runs in C."""
    low, high = 0, min(len(first), len(second))
    while low < high:
        middle = (low + high + 1) // 2
        if first[:middle] == second[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


@dataclass(frozen=True, slots=True)
class Bill:
    sent: int  # tokens of the request
    cached: int  # tokens billed as read from the cache
    written: int  # tokens billed as written to it (Anthropic)
    identical_prefix: int  # tokens shared with the previous request, whether the provider caches them or not
    billed: float  # in base-price tokens

    @property
    def cached_share(self) -> float:
        return self.cached / self.sent if self.sent else 0.0

    @property
    def identical_share(self) -> float:
        return self.identical_prefix / self.sent if self.sent else 0.0


class OpenAICache:
    """One run's requests, in order, under OpenAI's automatic prefix caching."""

    def __init__(self) -> None:
        self._previous: list[Block] = []
        self._expired = False

    def expire(self) -> None:
        """A pause longer than the cache keeps a prefix: the next request reads none."""
        self._expired = True

    def bill(self, blocks: list[Block]) -> Bill:
        sent = sent_tokens(blocks)
        prefix = common_prefix_tokens(self._previous, blocks)
        cached = 0 if prefix < OPENAI_MIN_CACHED or self._expired else \
            prefix - (prefix - OPENAI_MIN_CACHED) % OPENAI_STEP
        self._previous, self._expired = blocks, False
        return Bill(sent, cached, 0, prefix, CACHED_READ * cached + BASE * (sent - cached))


class AnthropicCache:
    """One run's requests, in order, under Anthropic's breakpoint caching (breakpoints as rendered)."""

    def __init__(self) -> None:
        self._written: set[int] = set()  # the identities of the prefixes written so far
        self._previous: list[Block] = []

    def expire(self) -> None:
        """A pause longer than the cache keeps an entry: every prefix written is gone."""
        self._written.clear()

    def bill(self, blocks: list[Block]) -> Bill:
        ends, prefixes = [], []
        end, prefix = 0, 0
        for block in blocks:
            end += block.size
            prefix = hash((prefix, block.identity))
            ends.append(end)
            prefixes.append(prefix)
        sent = end
        breakpoints = [i for i, block in enumerate(blocks) if block.breakpoint]
        read = 0
        for point in breakpoints:
            for boundary in range(point, max(-1, point - ANTHROPIC_LOOKBACK), -1):
                if prefixes[boundary] in self._written:
                    read = max(read, ends[boundary])
                    break
        cacheable = [point for point in breakpoints if ends[point] >= ANTHROPIC_MIN_CACHEABLE]
        last = ends[cacheable[-1]] if cacheable else 0
        written = max(0, last - read)
        self._written.update(prefixes[point] for point in cacheable)
        identical = common_prefix_tokens(self._previous, blocks)
        self._previous = blocks
        billed = CACHED_READ * read + CACHE_WRITE * written + BASE * (sent - max(read, last))
        return Bill(sent, read, written, identical, billed)
