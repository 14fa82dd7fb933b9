package dev.contextsidecar.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.contextsidecar.v1.AppendResult;
import dev.contextsidecar.v1.AssembleContextRequest;
import dev.contextsidecar.v1.AssembleContextResponse;
import dev.contextsidecar.v1.Event;
import dev.contextsidecar.v1.OpenRunRequest;
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
 */
class HostLoopTest extends SidecarTestBase {
  private static final String RUN_ID = "java-host-loop";
  private static final String COUNTER = "o200k_base";
  private static final int BUDGET = 1200;
  private static final int TURNS = 30;

  // An event as we sent it, with what the sidecar said it counts as stored (AppendResult.tokens)
  // and the tool its call_id names.
  private record Sent(String eventId, int seq, int iteration, String role, String content, String callId,
      String tool, int storedTokens) {}

  // Old tool results are fed as this placeholder once the transcript passes 80% of the budget
  // ([context.clearing], on by default), with N = the result's own count.
  private static final String CLEARED =
      "[tool result cleared to save context: tool %s, call_id \"%s\", %d tokens; call the tool again if it is needed]";

  @Test
  void thirtyTurnsWithToolCallsStayWithinTheBudgetAndRecount() {
    var opened = client.call(s -> s.openRun(OpenRunRequest.newBuilder().setRunId(RUN_ID)
        .setTokenCounter(COUNTER).setTranscriptTokenBudget(BUDGET).build()));
    assertEquals(BUDGET, opened.getSettings().getTranscriptTokenBudget());

    Random random = new Random(0x5eed);
    List<Sent> sent = new ArrayList<>();
    List<Event> deferred = new ArrayList<>();
    Map<String, String> tools = new HashMap<>();
    int turnsWithOmitted = 0;
    int parallelTurns = 0;
    int deferredResults = 0;
    for (int i = 1; i <= TURNS; i++) {
      List<Event> events = new ArrayList<>(deferred);
      deferred.clear();
      events.add(message("u" + i, "user", Recount.words(random, 10 + random.nextInt(20))));
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
            .setContent(Recount.words(random, 20 + random.nextInt(40))).build());
      }
      if (i % 7 == 0 && i < TURNS) {
        // The results come back after this turn: the host sends them with the next one.
        deferred.addAll(results);
        deferredResults += results.size();
      } else {
        events.addAll(results);
      }
      events.add(message("a" + i, "assistant", Recount.words(random, 10 + random.nextInt(20))));

      final int iteration = i;
      AssembleContextResponse window = client.call(s -> s.assembleContext(AssembleContextRequest
          .newBuilder().setRunId(RUN_ID).setIteration(iteration).addAllAppendEvents(events).build()));

      // Our record of the log, in send order; iteration 0 meant this one. The turn's events get
      // consecutive seqs after everything before (the sidecar's own entries, such as a
      // context.cleared, take seqs between turns).
      int firstSeq = window.getAppended(0).getSeq();
      assertTrue(sent.isEmpty() || firstSeq > sent.get(sent.size() - 1).seq(), "seqs grow");
      assertEquals(events.size(), window.getAppendedCount(), "one appended result per event");
      for (int k = 0; k < events.size(); k++) {
        Event e = events.get(k);
        AppendResult appended = window.getAppended(k);
        assertEquals(e.getEventId(), appended.getEventId());
        assertEquals(firstSeq + k, appended.getSeq());
        assertFalse(appended.getAlreadyRecorded());
        sent.add(new Sent(e.getEventId(), firstSeq + k, iteration, e.getRole(), e.getContent(),
            e.getCallId(), tools.getOrDefault(e.getCallId(), ""), appended.getTokens()));
      }
      checkWindow(window, iteration, sent);
      turnsWithOmitted += window.getOmittedEvents() > 0 ? 1 : 0;
    }
    // The loop exercised what it is meant to: the budget dropped older turns, parallel calls and
    // late results were sent.
    assertTrue(turnsWithOmitted >= TURNS / 2, "older turns were dropped on " + turnsWithOmitted + " turns");
    // Cleared results are checked whenever one is fed; this run may feed none: old results are
    // cleared only outside the recent turns, and here the start moves past them first.
    assertTrue(parallelTurns >= 10);
    assertTrue(deferredResults >= 4);
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
