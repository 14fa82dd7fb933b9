package dev.contextsidecar.client;

import dev.contextsidecar.v1.CountTokensRequest;
import dev.contextsidecar.v1.CountTokensResponse;
import java.util.List;
import java.util.Random;

/** Test helpers: the independent recount (CountTokens) and deterministic varied text. */
final class Recount {
  private static final String[] WORDS = {
    "kettle", "refund", "policy", "order", "invoice", "shipping", "warranty", "receipt", "label",
    "customer", "ticket", "delayed", "parcel", "address", "return", "window", "days", "the", "a",
    "was", "is", "and", "for", "with", "after", "because", "checked", "found", "asked", "sent",
    "updated", "lid", "handle", "switch", "cable", "boils", "water", "steel", "glass", "blue",
    "naïve", "café", "日本", "Grüße", "🙂", "x=3;", "{\"k\":", "—",
  };

  private Recount() {}

  /** Each text's count in {@code counter}, from the sidecar's CountTokens. */
  static List<Integer> count(SidecarClient client, String counter, List<String> texts) {
    CountTokensResponse counted = client.call(s -> s.countTokens(
        CountTokensRequest.newBuilder().setTokenCounter(counter).addAllTexts(texts).build()));
    return counted.getCountsList();
  }

  static int count(SidecarClient client, String counter, String text) {
    return count(client, counter, List.of(text)).get(0);
  }

  /** {@code text} as a JSON string literal. */
  static String json(String text) {
    return '"' + text.replace("\\", "\\\\").replace("\"", "\\\"") + '"';
  }

  /** {@code words} words drawn from a mixed vocabulary (non-ASCII included). */
  static String words(Random random, int words) {
    StringBuilder text = new StringBuilder();
    for (int w = 0; w < words; w++) {
      text.append(w == 0 ? "" : " ").append(WORDS[random.nextInt(WORDS.length)]);
    }
    return text.toString();
  }
}
