// A failed call as a class per gRPC status, carrying what the sidecar said: the machine code
// (google.rpc.ErrorInfo.reason) and each bad field (google.rpc.BadRequest), decoded from the
// grpc-status-details-bin trailer, as the Python, Go and Java clients give them.

import { Metadata, status, type ServiceError } from '@grpc/grpc-js';

import { BadRequest, ErrorInfo } from './gen/google/rpc/error_details.js';
import { Status } from './gen/google/rpc/status.js';

/** One bad field: its path in the request ("append_events[2].iteration") and what is wrong. */
export interface FieldViolation {
  field: string;
  description: string;
}

/** A call the sidecar (or the channel) refused. */
export class SidecarError extends Error {
  /** The RPC, e.g. "AssembleContext". */
  readonly method: string;
  /** The gRPC status code (grpc-js's `status`). */
  readonly code: status;
  /** The status message; it names the bad field. */
  readonly details: string;
  /** The sidecar's machine code ("validation_error", "not_found", ...; docs/errors.md), or ""
   * when the call never reached the sidecar. */
  readonly reason: string;
  /** The ErrorInfo's metadata, e.g. { events_needed: "3" }. */
  readonly info: Readonly<Record<string, string>>;
  readonly fieldViolations: readonly FieldViolation[];
  /** The call's trailing metadata, as grpc-js gave it. */
  readonly metadata: Metadata;

  constructor(method: string, code: status, details: string, reason = '', fieldViolations: FieldViolation[] = [],
    info: Record<string, string> = {}, metadata: Metadata = new Metadata()) {
    super(`${method}: ${status[code] ?? code}${reason ? ` (${reason})` : ''}: ${details}`);
    this.name = new.target.name;
    this.method = method;
    this.code = code;
    this.details = details;
    this.reason = reason;
    this.fieldViolations = fieldViolations;
    this.info = info;
    this.metadata = metadata;
  }
}

export class CancelledError extends SidecarError {}
export class UnknownError extends SidecarError {}
export class InvalidArgumentError extends SidecarError {}
export class DeadlineExceededError extends SidecarError {}
export class NotFoundError extends SidecarError {}
export class AlreadyExistsError extends SidecarError {}
export class PermissionDeniedError extends SidecarError {}
export class ResourceExhaustedError extends SidecarError {}
export class FailedPreconditionError extends SidecarError {}
export class AbortedError extends SidecarError {}
export class OutOfRangeError extends SidecarError {}
export class UnimplementedError extends SidecarError {}
export class InternalError extends SidecarError {}
export class UnavailableError extends SidecarError {}
export class DataLossError extends SidecarError {}
export class UnauthenticatedError extends SidecarError {}

const CLASSES: Partial<Record<status, typeof SidecarError>> = {
  [status.CANCELLED]: CancelledError,
  [status.UNKNOWN]: UnknownError,
  [status.INVALID_ARGUMENT]: InvalidArgumentError,
  [status.DEADLINE_EXCEEDED]: DeadlineExceededError,
  [status.NOT_FOUND]: NotFoundError,
  [status.ALREADY_EXISTS]: AlreadyExistsError,
  [status.PERMISSION_DENIED]: PermissionDeniedError,
  [status.RESOURCE_EXHAUSTED]: ResourceExhaustedError,
  [status.FAILED_PRECONDITION]: FailedPreconditionError,
  [status.ABORTED]: AbortedError,
  [status.OUT_OF_RANGE]: OutOfRangeError,
  [status.UNIMPLEMENTED]: UnimplementedError,
  [status.INTERNAL]: InternalError,
  [status.UNAVAILABLE]: UnavailableError,
  [status.DATA_LOSS]: DataLossError,
  [status.UNAUTHENTICATED]: UnauthenticatedError,
};

const TYPE_URL_PREFIX = 'type.googleapis.com/';

/** The error a failed call rejects with: grpc-js's ServiceError, its rich status decoded. */
export function callError(method: string, error: ServiceError): SidecarError {
  let reason = '';
  let info: Record<string, string> = {};
  let fieldViolations: FieldViolation[] = [];
  const [details] = error.metadata?.get('grpc-status-details-bin') ?? [];
  if (details instanceof Uint8Array) {
    for (const any of Status.decode(details).details) {
      if (any.type_url === `${TYPE_URL_PREFIX}google.rpc.ErrorInfo`) {
        const decoded = ErrorInfo.decode(any.value);
        reason = decoded.reason;
        info = decoded.metadata;
      } else if (any.type_url === `${TYPE_URL_PREFIX}google.rpc.BadRequest`) {
        fieldViolations = BadRequest.decode(any.value).field_violations
          .map(({ field, description }) => ({ field, description }));
      }
    }
  }
  const ErrorClass = CLASSES[error.code] ?? SidecarError;
  return new ErrorClass(method, error.code, error.details ?? '', reason, fieldViolations, info,
    error.metadata ?? new Metadata());
}
