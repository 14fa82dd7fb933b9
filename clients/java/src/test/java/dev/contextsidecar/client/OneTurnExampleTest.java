package dev.contextsidecar.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * The one-turn example of docs/other-languages.md, dev.contextsidecar.example.OneTurn, run as its
 * users run it: a JVM of its own with the sidecar's address and token in its environment, against
 * a sidecar with a tenant. Its output is what the docs promise.
 */
class OneTurnExampleTest {
  private static final String TOKEN = "java-example-token-0001";

  @Test
  void printsTheWindowAndTheRefusedCall() throws Exception {
    try (SidecarProcess sidecar = SidecarProcess.startOnUnixSocket(
        "[[auth.tenants]]\nid = \"acme\"\ntoken_sha256 = \"" + ErrorsTest.sha256(TOKEN) + "\"\n")) {
      ProcessBuilder example = new ProcessBuilder(javaExecutable(), "-cp", System.getProperty("java.class.path"),
          "dev.contextsidecar.example.OneTurn").redirectError(ProcessBuilder.Redirect.INHERIT);
      example.environment().put("SIDECAR_ADDRESS", sidecar.target());
      example.environment().put("SIDECAR_TOKEN", TOKEN);
      Process process = example.start();
      String output = new String(process.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
      assertTrue(process.waitFor(60, TimeUnit.SECONDS), "the example did not finish");
      assertEquals(0, process.exitValue(), output);
      assertEquals(List.of("u1 7 tokens", "c1 6 tokens", "r1 33 tokens", "INVALID_ARGUMENT validation_error",
          "events[0].event_id is required"), output.lines().toList());
    }
  }

  private static String javaExecutable() {
    return Path.of(System.getProperty("java.home"), "bin", "java").toString();
  }
}
