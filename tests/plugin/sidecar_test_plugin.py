"""A compaction policy that replaces all three hooks, each visibly:

- trigger: compaction is due on every third iteration, whatever the window's size;
- keep: the skills index is kept too, and the plan is no longer kept;
- summarise: the oldest two summarisable events (widened to keep tool calls with their results),
  summarised by the plugin itself;
and describes one agent-state subset, ``counter``. And a plugin that fails: its trigger raises on
iteration 6 while the window holds fewer than 1,000 tokens (a turn refused once it appended
its events and chose its window: tests/transcript/test_refused_turns.py).
"""

from __future__ import annotations

from sidecar.plugin_api import PLAN, SKILLS_INDEX, HookCall, KeepInput, SummariseInput, SummariseResult, TriggerInput


class EveryThirdTurn:
    state_schemas = {"counter": {"type": "integer", "minimum": 0}}

    def trigger(self, call: HookCall[TriggerInput, bool]) -> None:
        call.result = call.input.iteration % 3 == 0

    def keep(self, call: HookCall[KeepInput, frozenset]) -> None:
        call.result = (set(call.result) | {SKILLS_INDEX}) - {PLAN}

    def summarise(self, call: HookCall[SummariseInput, SummariseResult]) -> None:
        history = call.input.history()
        taken, open_calls = [], set()
        for event in history:
            if len(taken) >= 2 and not open_calls:
                break
            taken.append(event)
            if event.call_id:
                # A call stays open until every event of its group is taken.
                group = [e for e in history if e.call_id == event.call_id]
                open_calls.add(event.call_id)
                if all(e in taken for e in group):
                    open_calls.discard(event.call_id)
        if len(taken) < 2 or open_calls:
            return  # not enough to summarise: keep the built-in choice
        ids = tuple(e.event_id for e in taken)
        call.result = SummariseResult(ids, f"[plugin summary of {', '.join(ids)}]")


class FailsOnASmallSixthTurn:
    def trigger(self, call: HookCall[TriggerInput, bool]) -> None:
        if call.input.iteration == 6 and call.input.window_tokens < 1000:
            raise RuntimeError("the plugin fails on a small sixth turn")
