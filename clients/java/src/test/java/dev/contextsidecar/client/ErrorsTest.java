package dev.contextsidecar.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.contextsidecar.v1.AssembleContextRequest;
import dev.contextsidecar.v1.ContextSidecarGrpc.ContextSidecarBlockingStub;
import dev.contextsidecar.v1.CountTokensRequest;
import dev.contextsidecar.v1.Event;
import dev.contextsidecar.v1.GetTranscriptWindowRequest;
import dev.contextsidecar.v1.ListMemoryRequest;
import dev.contextsidecar.v1.ListRunEventsRequest;
import dev.contextsidecar.v1.OpenRunRequest;
import io.grpc.Status;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.HexFormat;
import java.util.List;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Failures decoded into code, reason and fields; the bearer token naming the tenant; the default
 * deadline. The sidecar here has two tenants and listens on a unix socket.
 */
class ErrorsTest {
  private static final String ACME = token();
  private static final String GLOBEX = token();

  private static SidecarProcess sidecar;
  private static SidecarClient acme;

  @BeforeAll
  static void start() throws Exception {
    // Only the tokens' SHA-256 goes into the config.
    sidecar = SidecarProcess.startOnUnixSocket(
        "[[auth.tenants]]\nid = \"acme\"\ntoken_sha256 = \"" + sha256(ACME) + "\"\n\n"
            + "[[auth.tenants]]\nid = \"globex\"\ntoken_sha256 = \"" + sha256(GLOBEX) + "\"\n");
    assertTrue(sidecar.target().startsWith("unix:"), sidecar.target());
    acme = connect(ACME);
  }

  @AfterAll
  static void stop() {
    if (acme != null) {
      acme.close();
    }
    if (sidecar != null) {
      sidecar.close();
    }
  }

  private static SidecarClient connect(String token) {
    return SidecarClient.builder().target(sidecar.target()).token(token).build();
  }

  @Test
  void badInputComesBackAsCodeReasonAndField() {
    String run = "java-errors";
    acme.call(s -> s.openRun(OpenRunRequest.newBuilder().setRunId(run).build()));
    SidecarException e = assertThrows(SidecarException.class, () -> acme.call(s -> s.assembleContext(
        AssembleContextRequest.newBuilder().setRunId(run).setIteration(1)
            .addAppendEvents(Event.newBuilder().setEventId("ok").setRole("user").setContent("hi"))
            .addAppendEvents(Event.newBuilder().setEventId("bad").setRole("robot").setContent("beep"))
            .build())));
    assertEquals(Status.Code.INVALID_ARGUMENT, e.getCode());
    assertEquals("validation_error", e.getReason());
    assertEquals("context-sidecar", e.getDomain());
    assertEquals(List.of("append_events[1].role"), e.getFields());
    assertTrue(e.getMessage().startsWith("INVALID_ARGUMENT validation_error: "), e.getMessage());
    // The call wrote nothing, not even the good event before the bad one.
    assertEquals(0, acme.call(s -> s.listRunEvents(
        ListRunEventsRequest.newBuilder().setRunId(run).build())).getEventsCount());

    // One field per kind of request, each named by its path.
    assertInvalid("iteration", s -> s.assembleContext(
        AssembleContextRequest.newBuilder().setRunId(run).setIteration(0).build()));
    assertInvalid("append_events[0].iteration", s -> s.assembleContext(
        AssembleContextRequest.newBuilder().setRunId(run).setIteration(2).addAppendEvents(
            Event.newBuilder().setEventId("late").setIteration(3).setRole("user").setContent("x")).build()));
    assertInvalid("token_counter", s -> s.countTokens(
        CountTokensRequest.newBuilder().setTokenCounter("nope").addTexts("x").build()));
    assertInvalid("token_budget", s -> s.listMemory(
        ListMemoryRequest.newBuilder().setMemoryRef("agent:java/notes").setTokenBudget(0).build()));
  }

  private static void assertInvalid(String field, Function<ContextSidecarBlockingStub, ?> rpc) {
    SidecarException e = assertThrows(SidecarException.class, () -> acme.call(rpc));
    assertEquals(Status.Code.INVALID_ARGUMENT, e.getCode(), e.getMessage());
    assertEquals("validation_error", e.getReason(), e.getMessage());
    assertEquals(List.of(field), e.getFields(), e.getMessage());
  }

  @Test
  void aFutureFailureDecodesToo() {
    var future = acme.future().countTokens(
        CountTokensRequest.newBuilder().setTokenCounter("nope").addTexts("x").build());
    ExecutionException failure = assertThrows(ExecutionException.class, () -> future.get(30, TimeUnit.SECONDS));
    SidecarException e = SidecarException.from(failure);
    assertEquals(Status.Code.INVALID_ARGUMENT, e.getCode());
    assertEquals("validation_error", e.getReason());
    assertEquals(List.of("token_counter"), e.getFields());
  }

  @Test
  void theTokenNamesTheTenant() {
    String run = "java-tenant-run";
    acme.call(s -> s.assembleContext(AssembleContextRequest.newBuilder().setRunId(run).setIteration(1)
        .addAppendEvents(Event.newBuilder().setEventId("u1").setRole("user").setContent("hello")).build()));
    GetTranscriptWindowRequest read = GetTranscriptWindowRequest.newBuilder().setRunId(run).setIteration(1).build();
    assertEquals(List.of("u1"), acme.call(s -> s.getTranscriptWindow(read)).getEventIdsList());

    // Another tenant's run answers as if it did not exist.
    try (SidecarClient globex = connect(GLOBEX)) {
      SidecarException e = assertThrows(SidecarException.class, () -> globex.call(s -> s.getTranscriptWindow(read)));
      assertEquals(Status.Code.NOT_FOUND, e.getCode());
      assertEquals("not_found", e.getReason());
    }
    // No token, or one that names no tenant: refused.
    for (String token : new String[] {null, token()}) {
      try (SidecarClient stranger = connect(token)) {
        SidecarException e = assertThrows(SidecarException.class, () -> stranger.call(s -> s.getTranscriptWindow(read)));
        assertEquals(Status.Code.UNAUTHENTICATED, e.getCode());
        assertEquals("unauthenticated", e.getReason());
      }
    }
  }

  @Test
  void everyUnaryCallGetsTheDefaultDeadlineUnlessItSetsOne() {
    CountTokensRequest request = CountTokensRequest.newBuilder().setTokenCounter("chars").addTexts("héllo").build();
    try (SidecarClient hasty = SidecarClient.builder().target(sidecar.target()).token(ACME)
        .deadline(Duration.ofNanos(1)).build()) {
      // A deadline that has passed before the call starts: it never reaches the sidecar.
      SidecarException e = assertThrows(SidecarException.class, () -> hasty.call(s -> s.countTokens(request)));
      assertEquals(Status.Code.DEADLINE_EXCEEDED, e.getCode());
      assertEquals("", e.getReason());
      assertEquals(List.of(), e.getFields());
      // A deadline the caller sets wins over the default.
      assertEquals(List.of(5), hasty.call(s -> s.withDeadlineAfter(30, TimeUnit.SECONDS).countTokens(request))
          .getCountsList());
    }
  }

  static String token() {
    byte[] bytes = new byte[24];
    new SecureRandom().nextBytes(bytes);
    return HexFormat.of().formatHex(bytes);
  }

  static String sha256(String token) {
    try {
      return HexFormat.of().formatHex(
          MessageDigest.getInstance("SHA-256").digest(token.getBytes(StandardCharsets.UTF_8)));
    } catch (java.security.NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }
}
