// @context-sidecar/client: the typed client of the context sidecar's gRPC API.

export { connect, METHODS, STREAMING_METHODS } from './client.js';
export type { CallOptions, ConnectOptions, HealthCheckResponse, RequestOf, ResponseOf, SidecarClient,
  TlsFiles } from './client.js';
export * from './errors.js';
export { status } from '@grpc/grpc-js';
// Every message of the API as a TypeScript interface (AssembleContextResponse, WindowEntry, ...).
export type * from './gen/contextsidecar/v1/sidecar.js';
