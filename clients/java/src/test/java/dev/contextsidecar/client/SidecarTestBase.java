package dev.contextsidecar.client;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.TestInstance;

/**
 * A test class with a sidecar process of its own, started once before its tests and stopped after
 * them, and a client of it: {@link #sidecar} and {@link #client}.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
abstract class SidecarTestBase {
  protected SidecarProcess sidecar;
  protected SidecarClient client;

  @BeforeAll
  void startSidecar() throws Exception {
    sidecar = SidecarProcess.start();
    client = SidecarClient.builder().target(sidecar.target()).build();
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
