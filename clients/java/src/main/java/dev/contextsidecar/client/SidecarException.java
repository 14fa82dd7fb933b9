package dev.contextsidecar.client;

import com.google.protobuf.Any;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.rpc.BadRequest;
import com.google.rpc.ErrorInfo;
import io.grpc.Status;
import io.grpc.protobuf.StatusProto;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * A failed sidecar call, decoded: the gRPC status code, and from the status details
 * (grpc-status-details-bin, a google.rpc.Status) the {@link ErrorInfo} reason, a stable machine
 * code such as {@code "validation_error"} (docs/errors.md), with its metadata, and the
 * {@link BadRequest} field violations naming each bad field ({@code "append_events[1].role"}).
 *
 * <p>A failure that never reached the sidecar (a refused connection, an expired deadline) has a
 * code but no reason and no fields.
 */
public final class SidecarException extends RuntimeException {
  private final Status.Code code;
  private final String description;
  private final ErrorInfo errorInfo;
  private final List<BadRequest.FieldViolation> violations;

  private SidecarException(
      Status status, ErrorInfo errorInfo, List<BadRequest.FieldViolation> violations, Throwable cause) {
    super(describe(status, errorInfo), cause);
    this.code = status.getCode();
    this.description = status.getDescription() == null ? "" : status.getDescription();
    this.errorInfo = errorInfo;
    this.violations = List.copyOf(violations);
  }

  /**
   * Decodes a grpc-java failure: a {@code StatusRuntimeException} or {@code StatusException},
   * or anything caused by one (a future's {@code ExecutionException}).
   */
  public static SidecarException from(Throwable failure) {
    Status status = Status.fromThrowable(failure);
    ErrorInfo info = ErrorInfo.getDefaultInstance();
    List<BadRequest.FieldViolation> violations = new ArrayList<>();
    com.google.rpc.Status details = StatusProto.fromThrowable(failure);
    if (details != null) {
      for (Any detail : details.getDetailsList()) {
        try {
          if (detail.is(ErrorInfo.class)) {
            info = detail.unpack(ErrorInfo.class);
          } else if (detail.is(BadRequest.class)) {
            violations.addAll(detail.unpack(BadRequest.class).getFieldViolationsList());
          }
        } catch (InvalidProtocolBufferException e) {
          // A detail that does not parse as its declared type: keep the status, drop the detail.
          failure.addSuppressed(e);
        }
      }
    }
    return new SidecarException(status, info, violations, failure);
  }

  private static String describe(Status status, ErrorInfo info) {
    String reason = info.getReason().isEmpty() ? "" : " " + info.getReason();
    String description = status.getDescription() == null ? "" : ": " + status.getDescription();
    return status.getCode() + reason + description;
  }

  /** The gRPC status code. */
  public Status.Code getCode() {
    return code;
  }

  /** The status message (human-readable; it names the bad field too). */
  public String getDescription() {
    return description;
  }

  /** ErrorInfo.reason: the machine code ("validation_error", "not_found", ...); "" if none. */
  public String getReason() {
    return errorInfo.getReason();
  }

  /** ErrorInfo.domain: "context-sidecar" for the sidecar's own errors; "" if none. */
  public String getDomain() {
    return errorInfo.getDomain();
  }

  /** ErrorInfo.metadata: the error's particulars (e.g. "events_needed", "from_seq"). */
  public Map<String, String> getMetadata() {
    return errorInfo.getMetadataMap();
  }

  /** The bad fields' paths, in the order the sidecar named them. */
  public List<String> getFields() {
    return violations.stream().map(BadRequest.FieldViolation::getField).toList();
  }

  /** The BadRequest field violations themselves (field and description). */
  public List<BadRequest.FieldViolation> getFieldViolations() {
    return violations;
  }
}
