"""Token counters, one per ``tokenCounter`` value of RFC 0111/0113, and deterministic clipping.

A count reported anywhere in the sidecar is ``counter.count(text)`` of the exact text reported
with it, so any client can recount it (``CountTokens``, or tiktoken / a code-point count of its
own). tiktoken counts use ``encode_ordinary``: text that looks like a special token
(``<|endoftext|>``) is counted as the ordinary text it is, since transcript content is data.
"""

from __future__ import annotations

from collections.abc import Callable
from json.encoder import encode_basestring  # the C encoder: json.dumps(s, ensure_ascii=False) for a str
from pathlib import Path
from typing import Protocol

import tiktoken

import fastcore
from sidecar.errors import TokenBudgetExceeded, ValidationError
from sidecar.settings import TOKEN_COUNTERS
from sidecar.text.encodings import SUPPORTED as TIKTOKEN_ENCODINGS
from sidecar.text.encodings import load_encoding


class TokenCounter(Protocol):
    name: str

    def count(self, text: str) -> int:
        """Tokens of ``text`` in this counter's unit."""

    def clip(self, text: str, target: int, opening: str = "", closing: str = "", quote: bool = False) -> str:
        """``opening + text + closing`` if it fits ``target``, else ``opening`` + the first units
        of ``text`` + elision marker + its last units + ``closing``, counting <= target; "" when
        even ``opening`` + marker + ``closing`` does not fit. A caller that must never feed a
        text emptied without a marker (the window) holds ``target`` at or above
        :meth:`marked_minimum`. ``quote``: what goes between ``opening`` and ``closing`` is fed
        as one JSON string (so a tool call's clipped arguments can stay one JSON object), and
        counted so."""

    def marked_minimum(self, units: int, opening: str = "", closing: str = "", quote: bool = False) -> int:
        """The count of the smallest clipped form of a text of ``units`` units: ``opening`` +
        elision marker + ``closing``. No clip of such a text fits a target below it."""


def elision_marker(elided: int, unit: str) -> str:
    return f"\n[... {elided} {unit} elided ...]\n"


def _as_is(text: str) -> str:
    return text


def _wrap(quote: bool) -> Callable[[str], str]:
    """What goes between a clip's opening and closing: the text, or the text as a JSON string."""
    return encode_basestring if quote else _as_is


def _marked_minimum(count: Callable[[str], int], units: int, unit: str, opening: str, closing: str,
                    quote: bool) -> int:
    return count(opening + _wrap(quote)(elision_marker(units, unit)) + closing)


def _clip(total: int, render: Callable[[int, int], tuple[str, str]], count: Callable[[str], int],
          target: int, unit: str, opening: str, closing: str, quote: bool) -> str:
    """Keep the first and last units of a text of ``total`` units, between ``opening`` and
    ``closing`` (kept whole), so the result fits ``target``; "" when no marked form fits.
    ``quote``: the kept units and the marker between them are one JSON string.

    ``render(head, tail)`` gives the text of the first ``head`` and last ``tail`` units. Every
    candidate is counted whole (tokens can merge across the joins), so the result's count is a
    recount of exactly what is fed. The search is deterministic: the same text and target always
    give the same bytes.
    """
    wrap = _wrap(quote)
    marker_only = opening + wrap(elision_marker(total, unit)) + closing
    floor = count(marker_only)
    if floor > target:
        return ""
    keep = target - floor
    while keep > 0:
        head, tail = (keep + 1) // 2, keep // 2
        head_text, tail_text = render(head, tail)
        candidate = opening + wrap(head_text + elision_marker(total - head - tail, unit) + tail_text) + closing
        used = count(candidate)
        if used <= target:
            return candidate
        keep -= used - target
    return marker_only


class TiktokenCounter:
    def __init__(self, encoding: tiktoken.Encoding) -> None:
        self.name = encoding.name
        self._encoding = encoding

    def count(self, text: str) -> int:
        return len(self._encoding.encode_ordinary(text))

    def clip(self, text: str, target: int, opening: str = "", closing: str = "", quote: bool = False) -> str:
        tokens = self._encoding.encode_ordinary(text)
        whole = opening + _wrap(quote)(text) + closing
        if (len(tokens) if whole == text else self.count(whole)) <= target:
            return whole
        decode = self._encoding.decode_bytes

        def render(head: int, tail: int) -> tuple[str, str]:
            # A token boundary can fall inside a character; drop the partial bytes at the cut.
            head_text = decode(tokens[:head]).decode("utf-8", "ignore")
            tail_text = decode(tokens[len(tokens) - tail:]).decode("utf-8", "ignore") if tail else ""
            return head_text, tail_text

        return _clip(len(tokens), render, self.count, target, "tokens", opening, closing, quote)

    def marked_minimum(self, units: int, opening: str = "", closing: str = "", quote: bool = False) -> int:
        return _marked_minimum(self.count, units, "tokens", opening, closing, quote)


class CharsCounter:
    """Unicode code points of the text, counted from its UTF-8 bytes by fastcore."""

    name = "chars"

    def count(self, text: str) -> int:
        return fastcore.count_code_points(text.encode("utf-8"))

    def clip(self, text: str, target: int, opening: str = "", closing: str = "", quote: bool = False) -> str:
        total = self.count(text)
        whole = opening + _wrap(quote)(text) + closing
        if self.count(whole) <= target:
            return whole
        return _clip(total, lambda head, tail: (text[:head], text[total - tail:] if tail else ""),
                     self.count, target, "chars", opening, closing, quote)

    def marked_minimum(self, units: int, opening: str = "", closing: str = "", quote: bool = False) -> int:
        return _marked_minimum(self.count, units, "chars", opening, closing, quote)


class HostDefinedCounter:
    """Counts belong to the host (its provider's tokenizer); the sidecar can neither make nor clip them."""

    name = "host-defined"

    def count(self, text: str) -> int:
        raise ValidationError.field(
            "token_counter", "host-defined counts come from the host; the sidecar cannot count text in them")

    def clip(self, text: str, target: int, opening: str = "", closing: str = "", quote: bool = False) -> str:
        raise TokenBudgetExceeded(
            "the active turn alone exceeds the token budget and host-defined text cannot be clipped "
            "by the sidecar; send the turn's events smaller or give the run a larger budget")

    def marked_minimum(self, units: int, opening: str = "", closing: str = "", quote: bool = False) -> int:
        self.clip("", 0)  # raises: the sidecar can neither count nor clip host-defined text
        return 0


class Counters:
    """All four counters, with both tiktoken encodings loaded up front (before SERVING)."""

    def __init__(self, encodings_dir: Path | None = None) -> None:
        self._by_name: dict[str, TokenCounter] = {
            name: TiktokenCounter(load_encoding(name, encodings_dir)) for name in TIKTOKEN_ENCODINGS}
        self._by_name["chars"] = CharsCounter()
        self._by_name["host-defined"] = HostDefinedCounter()
        assert tuple(self._by_name) == TOKEN_COUNTERS

    def get(self, name: str, field: str = "token_counter") -> TokenCounter:
        try:
            return self._by_name[name]
        except KeyError:
            raise ValidationError.field(
                field, f"is not a token counter; use one of {', '.join(TOKEN_COUNTERS)}") from None
