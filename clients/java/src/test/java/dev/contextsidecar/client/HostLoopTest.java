package dev.contextsidecar.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.contextsidecar.v1.AppendResult;
import dev.contextsidecar.v1.AssembleContextRequest;
import dev.contextsidecar.v1.AssembleContextResponse;
import dev.contextsidecar.v1.CompactionRecord;
import dev.contextsidecar.v1.Event;
import dev.contextsidecar.v1.ListCompactionRecordsRequest;
import dev.contextsidecar.v1.ListRunEventsRequest;
import dev.contextsidecar.v1.OpenRunRequest;
import dev.contextsidecar.v1.StoredEvent;
import dev.contextsidecar.v1.WindowEntry;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.Set;
import java.util.stream.Collectors;
import org.junit.jupiter.api.Test;

/**
 * A host's turn loop over 30 turns against a real sidecar: each turn sends its user message,
 * the assistant's tool calls (two in parallel on some turns, a result that arrives a turn late on
 * others), their results and the assistant's answer through AssembleContext, and checks the
 * window against our own record of what was sent, with every count recounted by CountTokens.
 *
 * <p>The sidecar's window settings and the turns' sizes are chosen so that the documented rules
 * (docs/transcript.md: "The window: cheap by default", "The recent turns") demand a clearing:
 *
 * <ul>
 *   <li>budget 2,000; trim_to_fraction 0.6, so the recent turns are the last keep_last_turns (2)
 *       and the older whole turns that fit with them in 1,200 tokens; a clearing is considered
 *       once the transcript fed from the window's start passes 0.8 of the budget (1,600), frees at
 *       least clear_at_least_tokens (500) and keeps the newest keep_recent (1) results.
 *   <li>A turn weighs about 440 tokens (two 20-word messages, ~8 of arguments a call, 300 words
 *       of results, ~370-390 tokens fenced), so turns 1-3 weigh about 1,340: nothing is cleared.
 *       Turn 4 brings the transcript to about 1,750, past the trigger. Its recent turns are turns
 *       3 and 4 (~890 tokens; turn 2 would make ~1,310, over 1,200), which hold the newest result.
 *       The results older than them are turns 1 and 2's, each freeing 340-355 tokens as a
 *       ~32-token placeholder: one is less than 500, both are more. So turn 4 clears exactly r1-0
 *       and r2-0, oldest first, and never turn 3's.
 *   <li>Placeholders and messages pile up, so later the window's start moves too.
 * </ul>
 */
class HostLoopTest extends SidecarTestBase {
  private static final String RUN_ID = "java-host-loop";
  private static final String COUNTER = "o200k_base";
  private static final int BUDGET = 2000;
  private static final int TURNS = 30;
  private static final int KEEP_LAST_TURNS = 2;
  private static final int TRIGGER = 1600; // 0.8 of the budget
  private static final int CLEAR_AT_LEAST = 500;
  private static final int FIRST_CLEARING_TURN = 4;
  private static final List<String> FIRST_CLEARED = List.of("r1-0", "r2-0");

  // An event as we sent it, with what the sidecar said it counts as stored (AppendResult.tokens)
  // and the tool its call_id names.
  private record Sent(String eventId, int seq, int iteration, String role, String content, String callId,
      String tool, int storedTokens) {}

  // An old tool result is fed as this placeholder once cleared, with N = the result's own count.
  private static final String CLEARED =
      "[tool result cleared to save context: tool %s, call_id \"%s\", %d tokens; call the tool again if it is needed]";

  // What the loop saw of clearings: the turn each result was first fed cleared, its placeholder,
  // and the turns that cleared.
  private final Map<String, Integer> clearedAt = new HashMap<>();
  private final Map<String, String> placeholders = new HashMap<>();
  private final Set<Integer> clearingTurns = new HashSet<>();

  @Override
  protected String[] sidecarFlags() {
    return new String[] {"--trim-to-fraction", "0.6", "--clearing-enabled", "--clearing-trigger-fraction", "0.8",
        "--clearing-keep-recent", "1", "--clearing-clear-at-least-tokens", String.valueOf(CLEAR_AT_LEAST)};
  }

  @Test
  void thirtyTurnsWithToolCallsStayWithinTheBudgetRecountAndClear() {
    var opened = client.call(s -> s.openRun(OpenRunRequest.newBuilder().setRunId(RUN_ID)
        .setTokenCounter(COUNTER).setTranscriptTokenBudget(BUDGET).setKeepLastTurns(KEEP_LAST_TURNS).build()));
    assertEquals(BUDGET, opened.getSettings().getTranscriptTokenBudget());

    Random random = new Random(0x5eed);
    List<Sent> sent = new ArrayList<>();
    List<Event> deferred = new ArrayList<>();
    Map<String, String> tools = new HashMap<>();
    int turnsWithOmitted = 0;
    int parallelTurns = 0;
    int deferredResults = 0;
    int transcript = 0; // the tokens appended up to the first clearing
    AssembleContextResponse previous = null;
    for (int i = 1; i <= TURNS; i++) {
      List<Event> events = new ArrayList<>(deferred);
      deferred.clear();
      events.add(message("u" + i, "user", Recount.words(random, 20)));
      int calls = i % 3 == 0 ? 2 : 1; // every third turn the model calls two tools at once
      parallelTurns += calls == 2 ? 1 : 0;
      List<Event> results = new ArrayList<>();
      for (int k = 0; k < calls; k++) {
        String callId = "call-" + i + "-" + k;
        String tool = k == 0 ? "search" : "read_file";
        tools.put(callId, tool);
        events.add(Event.newBuilder().setEventId("c" + i + "-" + k).setRole("assistant")
            .setType("tool_call").setCallId(callId).setToolName(tool)
            .setContent("{\"q\": " + Recount.json(Recount.words(random, 3)) + "}").build());
        results.add(Event.newBuilder().setEventId("r" + i + "-" + k).setRole("tool")
            .setType("tool_result").setCallId(callId)
            .setContent(Recount.words(random, 300 / calls)).build());
      }
      if (i % 7 == 0 && i < TURNS) {
        // The results come back after this turn: the host sends them with the next one.
        deferred.addAll(results);
        deferredResults += results.size();
      } else {
        events.addAll(results);
      }
      events.add(message("a" + i, "assistant", Recount.words(random, 20)));

      final int iteration = i;
      AssembleContextResponse window = client.call(s -> s.assembleContext(AssembleContextRequest
          .newBuilder().setRunId(RUN_ID).setIteration(iteration).addAllAppendEvents(events).build()));

      // Our record of the log, in send order; iteration 0 meant this one. The turn's events get
      // consecutive seqs after everything before: the sidecar's own context.cleared entry, written
      // after the events of a turn that cleared, takes one seq between turns.
      int firstSeq = window.getAppended(0).getSeq();
      int expectedSeq = sent.isEmpty() ? 0 : sent.get(sent.size() - 1).seq() + (clearingTurns.contains(i - 1) ? 2 : 1);
      assertEquals(expectedSeq, firstSeq, "turn " + i + ": the first seq");
      assertEquals(events.size(), window.getAppendedCount(), "one appended result per event");
      for (int k = 0; k < events.size(); k++) {
        Event e = events.get(k);
        AppendResult appended = window.getAppended(k);
        assertEquals(e.getEventId(), appended.getEventId());
        assertEquals(firstSeq + k, appended.getSeq());
        assertFalse(appended.getAlreadyRecorded());
        sent.add(new Sent(e.getEventId(), firstSeq + k, iteration, e.getRole(), e.getContent(),
            e.getCallId(), tools.getOrDefault(e.getCallId(), ""), appended.getTokens()));
        transcript += i <= FIRST_CLEARING_TURN ? appended.getTokens() : 0;
      }
      // The workload is as designed: the transcript passes the trigger first at turn 4.
      if (i <= FIRST_CLEARING_TURN) {
        assertEquals(i == FIRST_CLEARING_TURN, transcript > TRIGGER,
            "turn " + i + ": the transcript weighs " + transcript + " tokens: not the workload designed above");
      }
      checkWindow(window, iteration, sent);
      checkClearing(window, previous, iteration, sent);
      turnsWithOmitted += window.getOmittedEvents() > 0 ? 1 : 0;
      previous = window;
    }
    // The loop exercised what it is meant to: the budget dropped older turns and cleared old
    // tool results, parallel calls and late results were sent.
    assertTrue(turnsWithOmitted >= TURNS / 2, "older turns were dropped on " + turnsWithOmitted + " turns");
    assertTrue(clearingTurns.size() >= 2, "old tool results were cleared on turns " + clearingTurns);
    assertTrue(parallelTurns >= 10);
    assertTrue(deferredResults >= 4);
    checkClearingRecords(sent);
  }

  // The clearing the rules demand, at the turn they demand it, and the cache report naming it.
  private void checkClearing(AssembleContextResponse window, AssembleContextResponse previous, int iteration,
      List<Sent> sent) {
    String where = "turn " + iteration;
    List<WindowEntry> entries = window.getEntriesList();
    List<String> newlyCleared = new ArrayList<>();
    int firstNew = -1;
    for (int k = 0; k < entries.size(); k++) {
      WindowEntry entry = entries.get(k);
      if (entry.getClippedFromTokens() > 0 && !clearedAt.containsKey(entry.getEventId())) {
        clearedAt.put(entry.getEventId(), iteration);
        placeholders.put(entry.getEventId(), entry.getText());
        newlyCleared.add(entry.getEventId());
        firstNew = firstNew < 0 ? k : firstNew;
        // Never a result of the recent turns: the last keep_last_turns at least.
        assertTrue(entry.getIteration() <= iteration - KEEP_LAST_TURNS,
            where + ": " + entry.getEventId() + " of turn " + entry.getIteration() + " is cleared");
      }
    }
    if (iteration < FIRST_CLEARING_TURN) {
      assertEquals(List.of(), newlyCleared, where + ": nothing is cleared before the transcript passes the trigger");
    } else if (iteration == FIRST_CLEARING_TURN) {
      assertEquals(FIRST_CLEARED, newlyCleared,
          where + ": the results older than the recent turns, oldest first, " + CLEAR_AT_LEAST + " tokens at least");
    }
    // A clearing breaks the cached prefix at the oldest result newly fed cleared (after the
    // static prefix, part 0; the run has no task), everything before it repeated; a turn that
    // moved its start breaks there instead.
    var cache = window.getCache();
    if (!newlyCleared.isEmpty()) {
      clearingTurns.add(iteration);
      if (previous != null && previous.getEntries(0).getEventId().equals(entries.get(0).getEventId())) {
        int before = entries.subList(0, firstNew).stream().mapToInt(WindowEntry::getTokens).sum();
        assertEquals("tool_results_cleared", cache.getBreakReason(), where + ": cleared " + newlyCleared);
        assertEquals(1 + firstNew, cache.getBreakAt(), where + ": the break is at the first cleared result");
        assertEquals(before, cache.getStablePrefixTokens(), where + ": what is before it is stable");
      }
    } else {
      assertFalse(cache.getBreakReason().equals("tool_results_cleared"), where + ": nothing was newly cleared");
    }
  }

  // Each clearing is the sidecar's own context.cleared log entry, listed as a compaction record:
  // the results cleared, what they weighed when appended, what their placeholders weigh.
  private void checkClearingRecords(List<Sent> sent) {
    Map<String, Sent> byId = sent.stream().collect(Collectors.toMap(Sent::eventId, e -> e));
    List<CompactionRecord> records = client.call(s -> s.listCompactionRecords(
        ListCompactionRecordsRequest.newBuilder().setRunId(RUN_ID).build())).getRecordsList();
    int listed = 0;
    for (CompactionRecord record : records) {
      String where = "record " + record.getIndex();
      assertEquals("cleared", record.getKind(), where);
      assertTrue(clearingTurns.contains(record.getIteration()), where + ": at a turn that cleared");
      for (String id : record.getRemovedEventIdsList()) {
        assertEquals(record.getIteration(), clearedAt.get(id), where + ": " + id + " first fed cleared then");
      }
      List<String> ids = record.getRemovedEventIdsList();
      assertEquals(ids.stream().mapToInt(id -> byId.get(id).storedTokens()).sum(), record.getTokensBefore(), where);
      assertEquals(Recount.count(client, COUNTER, ids.stream().map(placeholders::get).toList()).stream()
          .mapToInt(Integer::intValue).sum(), record.getTokensAfter(), where);
      listed += ids.size();
      List<StoredEvent> logged = client.call(s -> s.listRunEvents(ListRunEventsRequest.newBuilder()
          .setRunId(RUN_ID).setFromSeq(record.getSeq()).setLimit(1).build())).getEventsList();
      assertEquals("context.cleared", logged.get(0).getType(), where + ": its log entry");
    }
    assertEquals(clearingTurns.size(), records.size(), "one record per clearing turn");
    assertEquals(clearedAt.size(), listed, "every result fed cleared is listed once");
  }

  private static Event message(String id, String role, String content) {
    return Event.newBuilder().setEventId(id).setRole(role).setContent(content).build();
  }

  private void checkWindow(AssembleContextResponse window, int iteration, List<Sent> sent) {
    String where = "turn " + iteration;
    List<WindowEntry> entries = window.getEntriesList();
    assertEquals(iteration, window.getIteration());
    assertEquals(COUNTER, window.getTokenCounter());
    assertEquals(BUDGET, window.getTokenBudget(), where);

    // Every entry's tokens is its text's count, recounted; the window is their sum, in budget.
    List<Integer> recounted = Recount.count(client, COUNTER,
        entries.stream().map(WindowEntry::getText).toList());
    assertEquals(recounted, entries.stream().map(WindowEntry::getTokens).toList(), where + ": recount");
    int sum = recounted.stream().mapToInt(Integer::intValue).sum();
    assertEquals(sum, window.getTokenCount(), where + ": token_count is the recounted sum");
    assertTrue(sum <= BUDGET, where + ": " + sum + " tokens within the budget " + BUDGET);

    // A contiguous recent tail of the log, in order; what is before it is omitted.
    List<Sent> tail = sent.subList(sent.size() - entries.size(), sent.size());
    assertEquals(tail.stream().map(Sent::eventId).toList(),
        entries.stream().map(WindowEntry::getEventId).toList(), where + ": the recent tail");
    assertEquals(window.getEventIdsList(), entries.stream().map(WindowEntry::getEventId).toList());
    assertEquals(sent.size() - entries.size(), window.getOmittedEvents(), where + ": omitted");
    assertTrue(tail.stream().map(Sent::iteration).collect(Collectors.toSet()).contains(iteration));
    assertTrue(sent.stream().filter(e -> e.iteration() == iteration).allMatch(tail::contains),
        where + ": the active turn is in whole");

    // A tool call and its results are in or out together.
    Set<String> inWindow = tail.stream().map(Sent::eventId).collect(Collectors.toCollection(HashSet::new));
    for (Sent e : tail) {
      if (!e.callId().isEmpty()) {
        for (Sent other : sent) {
          if (other.callId().equals(e.callId())) {
            assertTrue(inWindow.contains(other.eventId()), where + ": " + other.eventId() + " with its call");
          }
        }
      }
    }

    for (int k = 0; k < entries.size(); k++) {
      WindowEntry entry = entries.get(k);
      Sent record = tail.get(k);
      assertEquals(record.seq(), entry.getSeq());
      assertEquals(record.iteration(), entry.getIteration());
      assertEquals(record.role(), entry.getRole());
      assertEquals(record.callId(), entry.getCallId());
      if (entry.getClippedFromTokens() > 0) {
        // A cleared result: the placeholder, naming the tokens the result had.
        assertEquals("tool", record.role(), where + ": only tool results are cleared");
        assertTrue(record.iteration() < iteration, where + ": never in the active turn");
        assertEquals(record.storedTokens(), entry.getClippedFromTokens(), where + ": " + record.eventId());
        assertEquals(String.format(CLEARED, record.tool(), record.callId(), record.storedTokens()),
            entry.getText(), where + ": " + record.eventId() + " cleared");
      } else if (record.role().equals("tool")) {
        // Tool output is fed whole inside the untrusted-data block: what was stored and counted.
        assertTrue(entry.getText().contains(record.content()), where + ": the result inside its block");
        assertEquals(record.storedTokens(), entry.getTokens(), where + ": " + record.eventId() + " as stored");
      } else {
        assertEquals(record.content(), entry.getText(), where + ": " + record.eventId() + " fed verbatim");
        assertEquals(record.storedTokens(), entry.getTokens(), where + ": " + record.eventId() + " as stored");
      }
      if (entry.getType().equals("tool_call")) {
        assertFalse(entry.getToolName().isEmpty(), where + ": a tool call names its tool");
      }
    }
  }
}
