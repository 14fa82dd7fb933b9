package dev.contextsidecar.client;

import com.google.protobuf.UnknownFieldSet;
import dev.contextsidecar.v1.AppendEventsRequest;
import dev.contextsidecar.v1.AssembleContextRequest;
import dev.contextsidecar.v1.Event;
import dev.contextsidecar.v1.OpenRunRequest;
import io.grpc.CallOptions;
import io.grpc.MethodDescriptor;
import io.grpc.stub.ClientCalls;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.Random;

/**
 * The clients' common bench protocol, from Java: on the run "bench-java" (o200k_base, budget
 * 8000) it appends 200 events, assembles the last iteration once, then for each of N rounds
 * times one grpc.health.v1.Health/Check and one AssembleContext of that iteration (which
 * re-assembles and writes nothing), and prints one JSON line with the medians in microseconds.
 *
 * <pre>--target HOST:PORT [--rounds N (300)]</pre>
 */
public final class Bench {
  private static final String RUN_ID = "bench-java";
  private static final int BUDGET = 8000;
  private static final int EVENTS = 200;
  private static final String[] WORDS = {
    "kettle", "refund", "policy", "order", "invoice", "shipping", "warranty", "receipt", "label",
    "customer", "support", "ticket", "delayed", "parcel", "address", "return", "window", "days",
    "the", "a", "was", "is", "and", "for", "with", "after", "before", "because", "we", "you",
    "checked", "found", "asked", "sent", "updated", "closed", "opened", "replaced", "broken",
    "lid", "handle", "switch", "cable", "boils", "water", "litre", "steel", "glass", "blue",
  };

  // Health/Check without the grpc-services stubs: the request is an empty HealthCheckRequest
  // (service "": the whole server), the response's field 1 is the serving status.
  private static final MethodDescriptor<byte[], byte[]> HEALTH_CHECK =
      MethodDescriptor.<byte[], byte[]>newBuilder()
          .setType(MethodDescriptor.MethodType.UNARY)
          .setFullMethodName("grpc.health.v1.Health/Check")
          .setRequestMarshaller(new Bytes())
          .setResponseMarshaller(new Bytes())
          .build();
  private static final long SERVING = 1;

  private Bench() {}

  public static void main(String[] args) {
    String target = null;
    int rounds = 300;
    for (int i = 0; i < args.length; i++) {
      switch (args[i]) {
        case "--target" -> target = args[++i];
        case "--rounds" -> rounds = Integer.parseInt(args[++i]);
        default -> throw new IllegalArgumentException("unknown argument: " + args[i]);
      }
    }
    if (target == null || rounds < 1) {
      System.err.println("usage: Bench --target HOST:PORT [--rounds N]");
      System.exit(2);
    }

    try (SidecarClient client = SidecarClient.builder().target(target).build()) {
      client.call(s -> s.openRun(OpenRunRequest.newBuilder().setRunId(RUN_ID)
          .setTokenCounter("o200k_base").setTranscriptTokenBudget(BUDGET).build()));
      Random random = new Random(12);
      List<Event> events = new ArrayList<>();
      for (int i = 0; i < EVENTS; i++) {
        events.add(Event.newBuilder().setEventId("e" + i).setIteration(i / 4 + 1)
            .setRole(i % 2 == 0 ? "user" : "assistant").setContent(text(random, i)).build());
      }
      client.call(s -> s.appendEvents(
          AppendEventsRequest.newBuilder().setRunId(RUN_ID).addAllEvents(events).build()));
      int iteration = (EVENTS - 1) / 4 + 1;
      AssembleContextRequest assemble = AssembleContextRequest.newBuilder().setRunId(RUN_ID)
          .setIteration(iteration).setMaxTranscriptTokens(BUDGET).build();
      client.call(s -> s.assembleContext(assemble)); // persists the window; later calls re-read it

      long[] health = new long[rounds];
      long[] assembled = new long[rounds];
      for (int r = 0; r < rounds; r++) {
        long start = System.nanoTime();
        byte[] answer = ClientCalls.blockingUnaryCall(
            client.channel(), HEALTH_CHECK, CallOptions.DEFAULT, new byte[0]);
        health[r] = System.nanoTime() - start;
        if (!servingStatus(answer).equals(List.of(SERVING))) {
          throw new IllegalStateException("the sidecar is not serving");
        }
        start = System.nanoTime();
        client.call(s -> s.assembleContext(assemble));
        assembled[r] = System.nanoTime() - start;
      }
      System.out.printf(Locale.ROOT,
          "{\"client\": \"java\", \"health_p50_us\": %.1f, \"assemble_p50_us\": %.1f, \"rounds\": %d}%n",
          medianMicros(health), medianMicros(assembled), rounds);
    }
  }

  // ~60 words, different for every event.
  private static String text(Random random, int i) {
    StringBuilder text = new StringBuilder("Event ").append(i).append(':');
    for (int w = 0; w < 60; w++) {
      text.append(' ').append(WORDS[random.nextInt(WORDS.length)]);
      if (random.nextInt(10) == 0) {
        text.append(' ').append(random.nextInt(10_000));
      }
    }
    return text.append('.').toString();
  }

  private static List<Long> servingStatus(byte[] response) {
    try {
      return UnknownFieldSet.parseFrom(response).getField(1).getVarintList();
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  private static double medianMicros(long[] nanos) {
    long[] sorted = nanos.clone();
    Arrays.sort(sorted);
    int n = sorted.length;
    double median = n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0;
    return median / 1000.0;
  }

  private static final class Bytes implements MethodDescriptor.Marshaller<byte[]> {
    @Override
    public InputStream stream(byte[] value) {
      return new ByteArrayInputStream(value);
    }

    @Override
    public byte[] parse(InputStream stream) {
      try {
        return stream.readAllBytes();
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }
  }
}
