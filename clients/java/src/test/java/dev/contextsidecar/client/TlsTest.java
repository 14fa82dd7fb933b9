package dev.contextsidecar.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.contextsidecar.v1.AssembleContextRequest;
import dev.contextsidecar.v1.AssembleContextResponse;
import dev.contextsidecar.v1.Event;
import dev.contextsidecar.v1.GetCapabilitiesRequest;
import dev.contextsidecar.v1.OpenRunRequest;
import io.grpc.Status;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import javax.net.ssl.SSLHandshakeException;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * TLS and mTLS through {@link SidecarClient.Builder#tls}, against two real sidecars serving
 * {@code [server.tls]} with certificates made for this run ({@code python -m tests.certificates}):
 * one with TLS, one with mTLS (a client CA set), both with a tenant. The right CA (and under mTLS
 * a certificate that CA signed) gets a turn assembled with the tenant's token; a client trusting
 * another CA is refused, and under mTLS so is one without a certificate or with another CA's.
 */
class TlsTest {
  private static final String TOKEN = ErrorsTest.token();

  @TempDir
  static Path dir;

  private static Path certificates;
  private static SidecarProcess tls;
  private static SidecarProcess mtls;

  @BeforeAll
  static void start() throws Exception {
    certificates = dir.resolve("certificates");
    SidecarProcess.makeCertificates(certificates);
    Path config = Files.writeString(dir.resolve("sidecar.toml"),
        "[[auth.tenants]]\nid = \"host\"\ntoken_sha256 = \"" + ErrorsTest.sha256(TOKEN) + "\"\n");
    List<String> flags = List.of("--config", config.toString(),
        "--tls-cert-file", pem("server").toString(), "--tls-key-file", key("server").toString());
    tls = SidecarProcess.start(flags.toArray(String[]::new));
    List<String> mutual = new ArrayList<>(flags);
    mutual.addAll(List.of("--tls-client-ca-file", pem("ca").toString()));
    mtls = SidecarProcess.start(mutual.toArray(String[]::new));
  }

  @AfterAll
  static void stop() {
    for (SidecarProcess sidecar : new SidecarProcess[] {tls, mtls}) {
      if (sidecar != null) {
        sidecar.close();
      }
    }
  }

  private static Path pem(String stem) {
    return certificates.resolve(stem + ".pem");
  }

  private static Path key(String stem) {
    return certificates.resolve(stem + ".key");
  }

  private static SidecarClient connect(SidecarProcess sidecar, TlsFiles files) {
    return SidecarClient.builder(sidecar.target()).token(TOKEN).tls(files).build();
  }

  /** Opens a run and assembles its first turn: the window holds what was sent. */
  private static void assembleOneTurn(SidecarClient client, String run) {
    assertTrue(client.call(s -> s.openRun(
        OpenRunRequest.newBuilder().setRunId(run).setTokenCounter("chars").build())).getCreated());
    String content = "a question sent over TLS to " + run;
    AssembleContextResponse turn = client.call(s -> s.assembleContext(AssembleContextRequest.newBuilder()
        .setRunId(run).setIteration(1)
        .addAppendEvents(Event.newBuilder().setEventId("q1").setRole("user").setContent(content))
        .build()));
    assertEquals(List.of("q1 " + content),
        turn.getEntriesList().stream().map(e -> e.getEventId() + " " + e.getText()).toList());
  }

  /** The client's first call is refused before it reaches the sidecar: UNAVAILABLE, no reason. */
  private static SidecarException refusal(SidecarClient client) {
    SidecarException e = assertThrows(SidecarException.class,
        () -> client.call(s -> s.getCapabilities(GetCapabilitiesRequest.getDefaultInstance())));
    assertEquals(Status.Code.UNAVAILABLE, e.getCode(), e.getMessage());
    assertEquals("", e.getReason(), "the call never reached the sidecar");
    return e;
  }

  @Test
  void tlsWithTheCaAssemblesATurnTheTokenNamingTheTenant() {
    try (SidecarClient client = connect(tls, TlsFiles.of(pem("ca")))) {
      assembleOneTurn(client, "over-tls");
    }
    // The token still travels, and is checked, over TLS: without it the sidecar refuses the call.
    try (SidecarClient anonymous = SidecarClient.builder(tls.target()).tls(TlsFiles.of(pem("ca"))).build()) {
      SidecarException e = assertThrows(SidecarException.class,
          () -> anonymous.call(s -> s.getCapabilities(GetCapabilitiesRequest.getDefaultInstance())));
      assertEquals(Status.Code.UNAUTHENTICATED, e.getCode(), e.getMessage());
    }
  }

  @Test
  void tlsRefusesASidecarWhoseCertificateAnotherCaSigned() {
    try (SidecarClient client = connect(tls, TlsFiles.of(pem("other-ca").toString()))) {
      SidecarException e = refusal(client);
      Throwable cause = e;
      while (cause != null && !(cause instanceof SSLHandshakeException)) {
        cause = cause.getCause();
      }
      assertNotNull(cause, "the refusal was the TLS handshake's");
      assertTrue(String.valueOf(cause.getCause()).contains("certification path"), String.valueOf(cause.getCause()));
    }
  }

  @Test
  void tlsRefusesAPlaintextClient() {
    try (SidecarClient client = SidecarClient.builder(tls.target()).token(TOKEN).build()) {
      refusal(client);
    }
  }

  @Test
  void mtlsWithAClientCertificateTheCaSignedAssemblesATurn() {
    try (SidecarClient client = connect(mtls, TlsFiles.of(pem("ca"), pem("client"), key("client")))) {
      assembleOneTurn(client, "over-mtls");
    }
  }

  @Test
  void mtlsRefusesAClientWithoutACertificate() {
    try (SidecarClient client = connect(mtls, TlsFiles.of(pem("ca")))) {
      refusal(client);
    }
  }

  @Test
  void mtlsRefusesAClientCertificateAnotherCaSigned() {
    try (SidecarClient client = connect(mtls, TlsFiles.of(pem("ca"), pem("other-client"), key("other-client")))) {
      refusal(client);
    }
  }

  @Test
  void aCertificateWithAnotherOnesKeyIsAnErrorOfBuild() {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> connect(mtls, TlsFiles.of(pem("ca"), pem("client"), key("other-client"))));
    assertTrue(e.getMessage().contains(pem("client") + " and " + key("other-client")
        + " are not a PEM certificate chain and its private key"), e.getMessage());
  }

  @Test
  void aFileThatCannotBeReadOrHoldsNoCertificateIsAnErrorOfBuild() {
    Path absent = dir.resolve("absent.pem");
    IllegalArgumentException unreadable = assertThrows(IllegalArgumentException.class,
        () -> connect(tls, TlsFiles.of(absent)));
    assertTrue(unreadable.getMessage().startsWith("tls caFile: cannot read " + absent), unreadable.getMessage());
    IllegalArgumentException keyless = assertThrows(IllegalArgumentException.class,
        () -> connect(tls, TlsFiles.of(pem("ca"), pem("client"), absent)));
    assertTrue(keyless.getMessage().startsWith("tls keyFile: cannot read " + absent), keyless.getMessage());
    IllegalArgumentException notACertificate = assertThrows(IllegalArgumentException.class,
        () -> connect(tls, TlsFiles.of(key("client"))));
    assertTrue(notACertificate.getMessage().startsWith("tls caFile: " + key("client") + " holds no PEM certificate"),
        notACertificate.getMessage());
  }

  @Test
  void aCertificateWithoutItsKeyCannotBeGiven() {
    assertThrows(NullPointerException.class, () -> TlsFiles.of(pem("ca"), pem("client"), null));
    assertThrows(NullPointerException.class, () -> TlsFiles.of(pem("ca"), null, key("client")));
  }
}
