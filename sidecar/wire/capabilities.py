"""The capability document an OpenWOP host advertises for this sidecar (RFC 0111 wire words).

It states what the sidecar enforces for every run: the configured transcript budget is a
ceiling no run can exceed, in the configured default counter.
"""

from __future__ import annotations

from typing import Any

from sidecar.context_window.profiles import SKILL_PREFIX, STATIC_SECTIONS, TASK_SECTIONS, TRANSCRIPT_SECTIONS
from sidecar.context_window.sections import RENDERINGS
from sidecar.settings import ContextSettings, MemoryCompactionSettings, MemorySettings
from sidecar.text import fencing

EXECUTION_MODEL_VERSION = 5  # RFC 0061's stateful loop, which contextBudget is gated on


# The context-window capability: the declared order of the sections, by stability (wire words).
SECTION_ORDER = {"static": [*STATIC_SECTIONS],
                 "perTask": [*TASK_SECTIONS, SKILL_PREFIX + "<name>"],
                 "perTurn": [*TRANSCRIPT_SECTIONS]}


def capability_document(context: ContextSettings, memory: MemorySettings,
                        compaction: MemoryCompactionSettings | None = None,
                        hooks: dict[str, str] | None = None, state_subsets: list[str] | None = None) -> dict[str, Any]:
    execution_model: dict[str, Any] = {"version": EXECUTION_MODEL_VERSION}
    if context.transcript_window:
        execution_model["transcriptWindow"] = context.transcript_window
    execution_model["contextBudget"] = {
        "transcriptTokenBudget": context.transcript_token_budget,
        "tokenCounter": context.token_counter,
        "summarization": ({"supported": True, "strategy": context.summarization_strategy,
                           "keepLastTurns": context.keep_last_turns}
                          if context.summarization else {"supported": False}),
    }
    memory_block: dict[str, Any] = {
        "supported": True, "maxEntrySizeBytes": memory.max_entry_bytes, "ttlSupported": True,
        "injectionBudget": {"supported": True, "tokenCounter": memory.token_counter},
        "search": {"supported": True, "modes": ["lexical", "semantic"] if memory.embeddings else ["lexical"]},
    }
    if compaction is not None and compaction.enabled:
        # RFC 0012 §A: the background job (host-managed) and CompactMemory (client-requested).
        memory_block["compaction"] = {"supported": True, "trigger": "both",
                                      "maxInputEntries": compaction.max_input_entries,
                                      "maxOutputBytes": compaction.max_output_bytes}
    context_window: dict[str, Any] = {
        "supported": True, "sections": SECTION_ORDER, "renderings": list(RENDERINGS),
        "modelWindowTokens": context.model_window_tokens, "compactionFraction": context.compaction_fraction,
        # Who answers each compaction hook: "built-in", or the configured plugin's name.
        "compactionHooks": hooks or {"trigger": "built-in", "keep": "built-in", "summarise": "built-in"},
        "stateSchemas": state_subsets or [],
        # How untrusted content is fed: <tag source="...">, the preamble line, the content, </tag>.
        "untrustedBlock": {"tag": fencing.KEYWORD, "preamble": fencing.PREAMBLE},
    }
    if context.turn_budget_tokens:
        context_window["turnBudgetTokens"] = context.turn_budget_tokens
    return {
        "multiAgent": {"executionModel": execution_model},
        "contextWindow": context_window,
        # RFC 0004 memory, RFC 0113 injectionBudget. RFC 0113 ties rank 'relevance' to a semantic
        # memory.search; this sidecar says which modes it really serves: lexical (BM25) always,
        # semantic (cosine over host-supplied embeddings) when embeddings are on.
        "memory": memory_block,
    }
