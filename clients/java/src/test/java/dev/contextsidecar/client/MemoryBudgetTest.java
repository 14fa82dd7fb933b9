package dev.contextsidecar.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.contextsidecar.v1.ListMemoryRequest;
import dev.contextsidecar.v1.ListMemoryResponse;
import dev.contextsidecar.v1.MemoryEntry;
import dev.contextsidecar.v1.PutMemoryRequest;
import dev.contextsidecar.v1.PutMemoryResponse;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.api.Test;

/**
 * A budgeted ListMemory against the whole-entry rule (RFC 0113): only whole entries, their
 * recounted tokens within the budget, and the walk stopped where the next entry in rank order
 * would not fit. Entries over the budget on their own are passed over, never truncated.
 */
class MemoryBudgetTest extends SidecarTestBase {
  private static final String REF = "agent:java/notes";
  private static final String COUNTER = "o200k_base"; // the sidecar's default memory counter

  private record Put(String id, String content, int tokens) {}

  @Test
  void aBudgetedListHoldsOnlyWholeEntriesUpToTheFirstThatDoesNotFit() {
    // Oldest first; sizes vary, and the third newest is larger than every budget below but one.
    int[] words = {40, 12, 90, 25, 60, 8, 33, 70, 15, 400, 20, 45};
    Random random = new Random(7);
    List<Put> puts = new ArrayList<>();
    for (int k = 0; k < words.length; k++) {
      String content = "note " + k + ": " + Recount.words(random, words[k]);
      String id = "n" + k;
      PutMemoryResponse put = client.call(s -> s.putMemory(PutMemoryRequest.newBuilder()
          .setMemoryRef(REF).setEntryId(id).setContent(content).build()));
      int recounted = Recount.count(client, COUNTER, content);
      assertEquals(recounted, put.getTokens(), id + ": PutMemory's count recounts");
      puts.add(new Put(id, content, recounted));
    }
    List<Put> newestFirst = new ArrayList<>(puts);
    Collections.reverse(newestFirst);

    int stoppedAfterPassingOver = 0;
    for (int budget : new int[] {30, 100, 150, 250, 400, 5000}) {
      String where = "budget " + budget;
      ListMemoryResponse listed = client.call(s -> s.listMemory(ListMemoryRequest.newBuilder()
          .setMemoryRef(REF).setRank("recency").setTokenBudget(budget).build()));
      assertEquals(COUNTER, listed.getTokenCounter());

      // Whole entries only: each is exactly what was put, and its tokens recount.
      List<String> contents = listed.getEntriesList().stream().map(MemoryEntry::getContent).toList();
      List<Integer> recounted = contents.isEmpty() ? List.of() : Recount.count(client, COUNTER, contents);
      int used = 0;
      for (int k = 0; k < listed.getEntriesCount(); k++) {
        MemoryEntry entry = listed.getEntries(k);
        Put put = puts.stream().filter(p -> p.id().equals(entry.getId())).findFirst().orElseThrow();
        assertEquals(put.content(), entry.getContent(), where + ": " + entry.getId() + " whole");
        assertEquals((int) recounted.get(k), entry.getTokens(), where + ": " + entry.getId() + " recounts");
        used += recounted.get(k);
      }
      assertTrue(used <= budget, where + ": " + used + " recounted tokens within the budget");
      assertEquals(used, listed.getTokensUsed(), where + ": tokens_used");

      // In rank order (newest first), passing over only entries too large on their own, and
      // stopping where the next one would not fit in what is left.
      List<String> ids = listed.getEntriesList().stream().map(MemoryEntry::getId).toList();
      int at = 0;
      int passedOver = 0;
      for (String id : ids) {
        while (newestFirst.get(at).tokens() > budget) {
          at++;
          passedOver++;
        }
        assertEquals(newestFirst.get(at).id(), id, where + ": rank order");
        at++;
      }
      int leftOut = passedOver;
      while (at < newestFirst.size() && newestFirst.get(at).tokens() > budget) {
        at++;
        leftOut++;
      }
      if (at < newestFirst.size()) {
        Put next = newestFirst.get(at);
        assertTrue(used + next.tokens() > budget,
            where + ": the next entry, " + next.id() + " (" + next.tokens() + " tokens), would not fit");
        leftOut++;
        stoppedAfterPassingOver += passedOver > 0 ? 1 : 0;
      }
      assertEquals(leftOut, listed.getLeftOutForBudget(), where + ": left_out_for_budget");
    }
    // The budgets exercised the rule: some walk passed over an oversized entry, then stopped.
    assertTrue(stoppedAfterPassingOver >= 1);
  }
}
