"""The provider cache models that benchmarks/bench_cache_economics.py bills with, against sums worked by hand."""

from __future__ import annotations

import json

import pytest

from benchmarks._lib.prompt_cache import (
    FRAMING_TOKENS,
    AnthropicCache,
    OpenAICache,
    TokenCache,
    anthropic_blocks,
    openai_blocks,
)
from sidecar.text.encodings import load_encoding

ENCODING = load_encoding("o200k_base")
MARK = {"cache_control": {"type": "ephemeral"}}


def size(text: str) -> int:
    return len(ENCODING.encode_ordinary(text)) + FRAMING_TOKENS


def text(word: str, repeat: int) -> str:
    return " ".join(f"{word}{i}" for i in range(repeat))


SYSTEM = text("policy", 700)  # over 1,024 tokens: cacheable on its own
A, B, C, D, E = (text(word, 40) for word in ("alpha", "bravo", "charlie", "delta", "echo"))


def anthropic(messages: list[tuple[str, str, bool]]) -> str:
    """A Messages body: the system block marked, then one text block per message (marked when asked)."""
    return json.dumps({"system": [{"type": "text", "text": SYSTEM, **MARK}], "messages": [
        {"role": role, "content": [{"type": "text", "text": body, **(MARK if marked else {})}]}
        for role, body, marked in messages]})


def test_anthropic_reads_written_prefixes_writes_up_to_the_last_breakpoint_and_looks_back_20_blocks() -> None:
    tokens, cache = TokenCache(ENCODING), AnthropicCache()
    s, a, b, c, d, e = (size(t) for t in (SYSTEM, A, B, C, D, E))

    first = cache.bill(anthropic_blocks(anthropic([("user", A, False)]), tokens))
    assert (first.sent, first.cached, first.written) == (s + a, 0, s)
    assert first.billed == pytest.approx(1.25 * s + a)

    second = cache.bill(anthropic_blocks(anthropic([("user", A, False), ("assistant", B, False), ("user", C, True)]),
                                         tokens))
    assert (second.cached, second.written) == (s, a + b + c)
    assert second.billed == pytest.approx(0.1 * s + 1.25 * (a + b + c))

    # The breakpoint rolls on to E; C's prefix, written last turn, is found two blocks back.
    third = cache.bill(anthropic_blocks(anthropic([("user", A, False), ("assistant", B, False), ("user", C, False),
                                                   ("assistant", D, False), ("user", E, True)]), tokens))
    assert (third.cached, third.written) == (s + a + b + c, d + e)
    assert third.identical_prefix == s + a + b + c

    # 21 more messages before the only breakpoint: C's prefix is beyond the lookback, only the
    # system block (its own breakpoint) is read.
    history = [("user", A, False), ("assistant", B, False), ("user", C, False)]
    history += [("assistant" if i % 2 == 0 else "user", text(f"more{i}x", 5), False) for i in range(21)]
    history.append(("assistant", E, True))
    far = cache.bill(anthropic_blocks(anthropic(history), tokens))
    assert far.cached == s
    assert far.written == far.sent - s


def test_openai_caches_the_shared_prefix_from_1024_tokens_in_128_token_steps() -> None:
    tokens, cache = TokenCache(ENCODING), OpenAICache()

    def body(*items: str) -> str:
        return json.dumps({"instructions": SYSTEM, "input": [
            {"type": "message", "role": "user", "content": item} for item in items]})

    first = cache.bill(openai_blocks(body(A, B), tokens))
    assert first.cached == 0 and first.billed == first.sent
    second = cache.bill(openai_blocks(body(A, C), tokens))
    shared = size(SYSTEM) + size(A) + FRAMING_TOKENS  # C differs from B from its first token
    assert second.identical_prefix == shared
    assert second.cached == 1024 + (shared - 1024) // 128 * 128
    assert second.billed == pytest.approx(0.1 * second.cached + (second.sent - second.cached))
    short = OpenAICache()
    short.bill(openai_blocks(json.dumps({"input": [{"type": "message", "role": "user", "content": A}]}), tokens))
    again = short.bill(openai_blocks(json.dumps({"input": [{"type": "message", "role": "user", "content": A}]}),
                                     tokens))
    assert again.identical_prefix == again.sent and again.cached == 0  # under 1,024 tokens: never cached


def test_after_a_pause_past_the_cache_lifetime_nothing_is_read_once() -> None:
    tokens = TokenCache(ENCODING)
    body = anthropic([("user", A, False), ("assistant", B, True)])
    anthropic_cache = AnthropicCache()
    anthropic_cache.bill(anthropic_blocks(body, tokens))
    assert anthropic_cache.bill(anthropic_blocks(body, tokens)).cached > 0
    anthropic_cache.expire()
    cold = anthropic_cache.bill(anthropic_blocks(body, tokens))
    assert (cold.cached, cold.written) == (0, cold.sent)
    assert anthropic_cache.bill(anthropic_blocks(body, tokens)).cached == cold.sent, "written again, read again"

    openai_body = json.dumps({"instructions": SYSTEM, "input": [{"type": "message", "role": "user", "content": A}]})
    openai_cache = OpenAICache()
    openai_cache.bill(openai_blocks(openai_body, tokens))
    openai_cache.expire()
    assert openai_cache.bill(openai_blocks(openai_body, tokens)).cached == 0
    assert openai_cache.bill(openai_blocks(openai_body, tokens)).cached > 0
