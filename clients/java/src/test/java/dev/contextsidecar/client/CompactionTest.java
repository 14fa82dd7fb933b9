package dev.contextsidecar.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.contextsidecar.v1.AssembleContextRequest;
import dev.contextsidecar.v1.AssembleContextResponse;
import dev.contextsidecar.v1.Compaction;
import dev.contextsidecar.v1.Event;
import dev.contextsidecar.v1.GetArtifactRequest;
import dev.contextsidecar.v1.OpenRunRequest;
import dev.contextsidecar.v1.RecordSummaryRequest;
import dev.contextsidecar.v1.RecordSummaryResponse;
import dev.contextsidecar.v1.WindowEntry;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Random;
import java.util.Set;
import org.junit.jupiter.api.Test;

/**
 * Declared summarization from a host's loop: on a run with summarization on and a small budget,
 * whenever an AssembleContext answer says compaction is due, the host summarises the candidates
 * and records the summary with RecordSummary for the next turn, whose window then feeds the
 * summary in place of what it replaced.
 *
 * <p>When it is due, by the documented rules (docs/transcript.md, "Summaries and replays"), with
 * the sidecar's defaults (compaction_fraction 0.75, trim_to_fraction 0.6): once the transcript, or
 * after a summary what came after it, passes 450 tokens, and only if a summary of the candidates
 * would be fed in the next window. Here it always would: turns of two 30-word messages (~70
 * tokens) and keep_last_turns 1 make the recent turns at most 360 tokens (the last turn and the
 * older whole turns that fit in 0.6 of the budget), so past 450 the candidates (everything older)
 * are never empty, and the next window, the summary weighing what trim_to_fraction leaves (240)
 * beside the recent turns and an empty next turn, fits the budget of 600. So compaction is due
 * exactly when that count passes 450, and each summary is fed at the next turn; later, as turns
 * fill the window, its start moves past the summary, which the cache report calls
 * summary_slid_out.
 */
class CompactionTest extends SidecarTestBase {
  private static final String RUN_ID = "java-compaction";
  private static final String COUNTER = "o200k_base";
  private static final int BUDGET = 600;
  private static final int TURNS = 16;
  private static final int TRIGGER = 450; // compaction_fraction 0.75 of the budget

  private record Sent(String eventId, int iteration, String content) {}

  private record Summary(String ref, String text, Set<String> replaced, int iteration) {}

  private int slidOut; // turns whose window left out a summary the previous one fed

  @Test
  void recordsASummaryWheneverCompactionIsDue() {
    var opened = client.call(s -> s.openRun(OpenRunRequest.newBuilder().setRunId(RUN_ID)
        .setTokenCounter(COUNTER).setTranscriptTokenBudget(BUDGET).setKeepLastTurns(1)
        .setSummarizationSupported(true).build()));
    assertTrue(opened.getSettings().getSummarizationSupported());

    Random random = new Random(42);
    List<Sent> sent = new ArrayList<>();
    List<Summary> summaries = new ArrayList<>();
    int unsummarised = 0; // index in `sent` of the oldest event no summary replaced
    int since = 0; // the tokens appended after the newest summary (all, before one)
    List<String> previous = List.of(); // the summaries the previous window fed
    for (int i = 1; i <= TURNS; i++) {
      final int iteration = i;
      List<Event> events = List.of(
          Event.newBuilder().setEventId("u" + i).setRole("user").setContent(Recount.words(random, 30)).build(),
          Event.newBuilder().setEventId("a" + i).setRole("assistant").setContent(Recount.words(random, 30)).build());
      AssembleContextResponse window = client.call(s -> s.assembleContext(AssembleContextRequest
          .newBuilder().setRunId(RUN_ID).setIteration(iteration).addAllAppendEvents(events).build()));
      events.forEach(e -> sent.add(new Sent(e.getEventId(), iteration, e.getContent())));
      since += window.getAppendedList().stream().mapToInt(a -> a.getTokens()).sum();
      previous = checkWindow(window, summaries, previous);

      Summary last = summaries.isEmpty() ? null : summaries.get(summaries.size() - 1);
      if (last != null && last.iteration() == iteration) {
        assertFalse(window.getCompaction().getDue(), "turn " + i + ": not due again right after a summary");
      }
      Compaction compaction = window.getCompaction();
      assertEquals(since > TRIGGER, compaction.getDue(),
          "turn " + i + ": due with " + since + " tokens since the last summary, the trigger " + TRIGGER);
      if (!compaction.getDue()) {
        continue;
      }
      // The candidates: the oldest unsummarised events, in order, without gaps, never this turn's.
      List<String> candidates = compaction.getCandidateEventIdsList();
      assertFalse(candidates.isEmpty(), "turn " + i + ": due with candidates");
      List<Sent> replaced = sent.subList(unsummarised, unsummarised + candidates.size());
      assertEquals(replaced.stream().map(Sent::eventId).toList(), candidates, "turn " + i + ": oldest first");
      assertTrue(replaced.stream().allMatch(e -> e.iteration() < iteration), "turn " + i + ": not the active turn");
      int before = Recount.count(client, COUNTER, replaced.stream().map(Sent::content).toList())
          .stream().mapToInt(Integer::intValue).sum();
      assertEquals(before, compaction.getTokensBefore(), "turn " + i + ": tokens_before recounts");

      String text = "Summary of turns " + replaced.get(0).iteration() + " to "
          + replaced.get(replaced.size() - 1).iteration() + ": the user asked about "
          + replaced.get(0).content().split(" ")[0] + "; the assistant answered.";
      RecordSummaryResponse recorded = client.call(s -> s.recordSummary(RecordSummaryRequest.newBuilder()
          .setRunId(RUN_ID).setIteration(iteration + 1).addAllReplacedEventIds(candidates)
          .setSummaryText(text).build()));
      assertTrue(recorded.getCreated());
      assertEquals(compaction.getTokensBefore(), recorded.getTokensBefore());
      assertEquals(Recount.count(client, COUNTER, text), recorded.getTokensAfter(), "tokens_after recounts");
      assertEquals("context.summarized", recorded.getEvent().getType());
      String stored = client.call(s -> s.getArtifact(GetArtifactRequest.newBuilder().setRunId(RUN_ID)
          .setArtifactId(recorded.getSummaryRef()).build())).getContent();
      assertEquals(text, stored, "the artifact is the summary's text");
      summaries.add(new Summary(recorded.getSummaryRef(), text, new HashSet<>(candidates), iteration + 1));
      unsummarised += candidates.size();
      since = 0;
    }
    assertTrue(summaries.size() >= 2, "compaction came due " + summaries.size() + " times");
    assertTrue(slidOut >= 1, "a summary slid out on " + slidOut + " turns");
  }

  // The window feeds the summaries in force first, as themselves, and nothing they replaced; a
  // summary recorded for this turn is fed in it, and the cache report says where it entered; a
  // summary fed before that the window's start moved past is reported as slid out. Returns the
  // summaries fed.
  private List<String> checkWindow(AssembleContextResponse window, List<Summary> summaries, List<String> previous) {
    String where = "turn " + window.getIteration();
    List<WindowEntry> entries = window.getEntriesList();
    List<Integer> recounted = Recount.count(client, COUNTER, entries.stream().map(WindowEntry::getText).toList());
    assertEquals(recounted, entries.stream().map(WindowEntry::getTokens).toList(), where + ": recount");
    assertTrue(window.getTokenCount() <= BUDGET, where + ": within the budget");
    assertEquals(recounted.stream().mapToInt(Integer::intValue).sum(), window.getTokenCount());

    Set<String> replaced = new HashSet<>();
    List<Summary> inForce = summaries.stream().filter(s -> s.iteration() <= window.getIteration()).toList();
    inForce.forEach(s -> replaced.addAll(s.replaced()));
    for (WindowEntry entry : entries) {
      assertFalse(replaced.contains(entry.getEventId()), where + ": " + entry.getEventId() + " was summarised");
    }
    List<WindowEntry> fed = entries.stream().filter(e -> e.getType().equals("context.summary")).toList();
    List<String> fedRefs = fed.stream().map(WindowEntry::getEventId).toList();
    assertEquals(fed, entries.subList(0, fed.size()), where + ": summaries come first");
    int entered = 0;
    while (entered < fedRefs.size() && previous.contains(fedRefs.get(entered))) {
      entered++;
    }
    var cache = window.getCache();
    Summary newest = inForce.isEmpty() ? null : inForce.get(inForce.size() - 1);
    if (newest != null && newest.iteration() == window.getIteration()) {
      assertFalse(fed.isEmpty(), where + ": the summary recorded for this turn is fed");
      WindowEntry entry = fed.get(fed.size() - 1);
      assertEquals(newest.ref(), entry.getEventId(), where + ": the newest summary");
      assertEquals(newest.text(), entry.getText(), where + ": fed as written");
      assertEquals("summary_recorded", cache.getBreakReason(), where + ": the cache report");
      assertEquals(1 + entered, cache.getBreakAt(), where + ": the break is where the summary entered");
    } else {
      assertEquals(fedRefs.size(), entered, where + ": no summary enters but the one recorded for the turn");
      if (!fedRefs.containsAll(previous)) {
        assertEquals("summary_slid_out", cache.getBreakReason(), where + ": a summary fed before left");
        slidOut++;
      }
    }
    if (!fed.isEmpty()) {
      // The newest summary in force stands last among them, as written.
      assertEquals(newest.ref(), fed.get(fed.size() - 1).getEventId(), where + ": the newest summary");
    }
    return fedRefs;
  }
}
