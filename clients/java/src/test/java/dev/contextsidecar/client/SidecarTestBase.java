package dev.contextsidecar.client;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.TestInstance;

/**
 * A test class with a sidecar process of its own, started once before its tests (with {@link
 * #sidecarFlags()}) and stopped after them, and a client of it: {@link #sidecar} and {@link
 * #client}.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
abstract class SidecarTestBase {
  protected SidecarProcess sidecar;
  protected SidecarClient client;

  @BeforeAll
  void startSidecar() throws Exception {
    sidecar = SidecarProcess.start(sidecarFlags());
    client = SidecarClient.builder().target(sidecar.target()).build();
  }

  /** The flags the class's sidecar starts with, after the common ones: none by default. */
  protected String[] sidecarFlags() {
    return new String[0];
  }

  @AfterAll
  void stopSidecar() {
    if (client != null) {
      client.close();
    }
    if (sidecar != null) {
      sidecar.close();
    }
  }
}
