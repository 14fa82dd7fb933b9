"""A turn's input cost, modelled from ``[inspector]``'s price table over what the domain recorded.

The provider's own figures win where the host gave them (RecordUsage): Anthropic's cache reads,
cache writes and input after them, or OpenAI's cached tokens within its input. Otherwise the
turn's cache report predicts the cached prefix (``stable_prefix_tokens``) of the request it
counted (``request_tokens``), and the rest of the request is billed as uncached input, or, for a
request rendered for Anthropic (whose last block carries a cache breakpoint), as written to the
cache for the next turn to read. A provider's minimum cacheable prefix is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.settings import InspectorSettings
from sidecar.transcript.transcripts import TurnOverview

MILLION = 1_000_000
REPORTED = "reported by the provider (RecordUsage)"
PREDICTED = "predicted by the cache report"


@dataclass(frozen=True, slots=True)
class InputCost:
    uncached_tokens: int
    cached_tokens: int
    written_tokens: int  # to the prompt cache
    source: str  # REPORTED or PREDICTED
    usd: float  # at the table's prices
    without_caching_usd: float  # the same tokens, every one at the uncached input price

    @property
    def tokens(self) -> int:
        return self.uncached_tokens + self.cached_tokens + self.written_tokens


def input_cost(turn: TurnOverview, prices: InspectorSettings) -> InputCost:
    usage = turn.usage
    if usage is not None and (usage.cache_read_input_tokens or usage.cache_creation_input_tokens):
        uncached, cached, written = usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens
        source = REPORTED
    elif usage is not None:
        uncached, cached, written = usage.input_tokens - usage.cached_tokens, usage.cached_tokens, 0
        source = REPORTED
    else:
        request = turn.request_tokens or turn.fed_tokens  # a report persisted before it counted the request
        cached = min(turn.predicted_cached_tokens, request)
        rest = request - cached
        uncached, written = (0, rest) if turn.rendering == "anthropic_messages" else (rest, 0)
        source = PREDICTED
    usd = (uncached * prices.input_usd_per_mtok + cached * prices.cached_input_usd_per_mtok
           + written * prices.cache_write_usd_per_mtok) / MILLION
    return InputCost(uncached, cached, written, source, usd,
                     (uncached + cached + written) * prices.input_usd_per_mtok / MILLION)
