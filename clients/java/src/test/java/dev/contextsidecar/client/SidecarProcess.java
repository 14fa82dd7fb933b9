package dev.contextsidecar.client;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * A real sidecar for one test class: {@code python -m sidecar serve} on a free loopback port or a
 * unix socket, its storage in a fresh temporary folder, run from the repository root with the
 * python on PATH (or $SIDECAR_PYTHON), as the Node.js client's tests do. {@link #target()} is
 * the address from its first stdout line, "context-sidecar serving on ADDRESS".
 */
final class SidecarProcess implements AutoCloseable {
  private static final Pattern READY = Pattern.compile("^context-sidecar serving on (\\S+)$");
  private static final long READY_TIMEOUT_SECONDS = 60;

  private final Process process;
  private final Path dir;
  private final String target;
  private final StringBuffer stderr = new StringBuffer();

  private SidecarProcess(Path dir, String listen, List<String> flags) throws IOException {
    this.dir = dir;
    List<String> command = new ArrayList<>(List.of(python(), "-m", "sidecar", "serve",
        "--listen", listen, "--storage-path", dir.resolve("data").toString(),
        "--log-level", "WARNING"));
    command.addAll(flags);
    this.process = new ProcessBuilder(command).directory(repositoryRoot().toFile()).start();
    drain(process.getErrorStream(), stderr);
    this.target = awaitReady();
  }

  /** Starts a sidecar on a free loopback port, with {@code flags} after the common ones. */
  static SidecarProcess start(String... flags) throws IOException {
    return new SidecarProcess(Files.createTempDirectory("cs-java-"), "127.0.0.1:0", List.of(flags));
  }

  /**
   * Starts a sidecar on a unix socket (the other transport a host uses), with a {@code --config}
   * file holding {@code toml}.
   */
  static SidecarProcess startOnUnixSocket(String toml) throws IOException {
    Path dir = Files.createTempDirectory("cs-java-");
    Path config = Files.writeString(dir.resolve("sidecar.toml"), toml);
    return new SidecarProcess(dir, "unix://" + dir.resolve("sidecar.sock"),
        List.of("--config", config.toString()));
  }

  /**
   * Writes a fresh CA and its certificates into {@code folder} with {@code python -m
   * tests.certificates} (as every suite's TLS tests do): ca.pem, server.pem/.key,
   * client.pem/.key, other-ca.pem, other-client.pem/.key, ...
   */
  static void makeCertificates(Path folder) throws IOException, InterruptedException {
    Process made = new ProcessBuilder(python(), "-m", "tests.certificates", folder.toString())
        .directory(repositoryRoot().toFile()).redirectErrorStream(true).start();
    String output = new String(made.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    if (made.waitFor() != 0) {
      throw new IOException("python -m tests.certificates failed:\n" + output);
    }
  }

  private static String python() {
    return System.getenv().getOrDefault("SIDECAR_PYTHON", "python");
  }

  /** The repository root, so that {@code -m sidecar} resolves without an installed package. */
  private static Path repositoryRoot() {
    return Path.of(System.getProperty("sidecar.repoRoot", "../..")).toAbsolutePath().normalize();
  }

  String target() {
    return target;
  }

  private String awaitReady() throws IOException {
    CompletableFuture<String> ready = new CompletableFuture<>();
    Thread reader = new Thread(() -> {
      try (BufferedReader lines = new BufferedReader(
          new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
        for (String line; (line = lines.readLine()) != null; ) {
          Matcher m = READY.matcher(line.strip());
          if (m.matches()) {
            ready.complete(m.group(1));
          }
        }
      } catch (IOException ignored) {
        // The process is gone: handled below.
      }
      ready.completeExceptionally(new IOException("sidecar exited before it was ready"));
    }, "sidecar-stdout");
    reader.setDaemon(true);
    reader.start();
    try {
      return ready.get(READY_TIMEOUT_SECONDS, TimeUnit.SECONDS);
    } catch (ExecutionException | TimeoutException e) {
      close();
      throw new IOException("sidecar not ready: " + e.getMessage() + "; stderr:\n" + stderr, e);
    } catch (InterruptedException e) {
      close();
      Thread.currentThread().interrupt();
      throw new IOException("interrupted while starting the sidecar", e);
    }
  }

  private static void drain(InputStream stream, StringBuffer into) {
    Thread thread = new Thread(() -> {
      try (BufferedReader lines = new BufferedReader(new InputStreamReader(stream, StandardCharsets.UTF_8))) {
        for (String line; (line = lines.readLine()) != null; ) {
          into.append(line).append('\n');
        }
      } catch (IOException ignored) {
        // The process is gone.
      }
    }, "sidecar-stderr");
    thread.setDaemon(true);
    thread.start();
  }

  /** SIGTERM (the sidecar drains and exits), SIGKILL if it has not within 10 s; then its files go. */
  @Override
  public void close() {
    process.destroy();
    try {
      if (!process.waitFor(10, TimeUnit.SECONDS)) {
        process.destroyForcibly().waitFor();
      }
    } catch (InterruptedException e) {
      process.destroyForcibly();
      Thread.currentThread().interrupt();
    }
    try (var paths = Files.walk(dir)) {
      paths.sorted((a, b) -> b.compareTo(a)).forEach(p -> p.toFile().delete());
    } catch (IOException ignored) {
      // A leftover temporary folder is harmless.
    }
  }
}
