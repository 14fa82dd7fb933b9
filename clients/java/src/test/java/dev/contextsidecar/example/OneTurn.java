package dev.contextsidecar.example;

import com.google.rpc.BadRequest;
import dev.contextsidecar.client.SidecarClient;
import dev.contextsidecar.client.SidecarException;
import dev.contextsidecar.v1.AppendEventsRequest;
import dev.contextsidecar.v1.AssembleContextRequest;
import dev.contextsidecar.v1.AssembleContextResponse;
import dev.contextsidecar.v1.Event;
import dev.contextsidecar.v1.OpenRunRequest;
import dev.contextsidecar.v1.WindowEntry;

/**
 * One turn of a host, and a refused call decoded. The sidecar is at $SIDECAR_ADDRESS
 * (127.0.0.1:50051 when unset); $SIDECAR_TOKEN is the tenant's token, if it has tenants.
 */
public final class OneTurn {
  public static void main(String[] args) {
    String address = System.getenv().getOrDefault("SIDECAR_ADDRESS", "127.0.0.1:50051");
    try (SidecarClient client = SidecarClient.builder()
        .target(address).token(System.getenv("SIDECAR_TOKEN")).build()) {
      client.call(s -> s.openRun(OpenRunRequest.newBuilder().setRunId("run-1")
          .setTokenCounter("o200k_base").setTranscriptTokenBudget(8000).build()));
      AssembleContextResponse turn = client.call(s -> s.assembleContext(AssembleContextRequest.newBuilder()
          .setRunId("run-1").setIteration(1)
          .addAppendEvents(Event.newBuilder().setEventId("u1").setRole("user")
              .setContent("What does the refund policy say?"))
          .addAppendEvents(Event.newBuilder().setEventId("c1").setRole("assistant").setType("tool_call")
              .setCallId("k1").setToolName("search").setContent("{\"q\": \"refund\"}"))
          .addAppendEvents(Event.newBuilder().setEventId("r1").setRole("tool").setType("tool_result")
              .setCallId("k1").setContent("30 days."))
          .build()));
      for (WindowEntry entry : turn.getEntriesList()) {
        System.out.println(entry.getEventId() + " " + entry.getTokens() + " tokens");
      }

      try {
        client.call(s -> s.appendEvents(AppendEventsRequest.newBuilder().setRunId("run-1")
            .addEvents(Event.newBuilder().setRole("user")).build()));
      } catch (SidecarException e) {
        System.out.println(e.getCode() + " " + e.getReason());
        for (BadRequest.FieldViolation field : e.getFieldViolations()) {
          System.out.println(field.getField() + " " + field.getDescription());
        }
      }
    }
  }
}
