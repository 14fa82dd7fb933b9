// The client: one typed method per RPC of contextsidecar.v1.ContextSidecar, named like the RPC
// in lowerCamelCase, each taking the request as a plain object with the proto's snake_case
// fields (any field may be left out: it is its zero value) and answering the decoded response.

import fs from 'node:fs';
import { X509Certificate } from 'node:crypto';

import { Client as GrpcClient, credentials, Metadata, type ChannelCredentials, type ChannelOptions,
  type ClientReadableStream, type ServiceError } from '@grpc/grpc-js';
import { BinaryReader, BinaryWriter, WireType } from '@bufbuild/protobuf/wire';

import { callError } from './errors.js';
import { ContextSidecarDefinition, type DeepPartial } from './gen/contextsidecar/v1/sidecar.js';
import { CHANNEL_OPTIONS, DEFAULT_DEADLINE_MS, DEFAULT_RETRIES, pauseBeforeRetry, retryable } from './retry.js';

type Definition = typeof ContextSidecarDefinition.methods;
type MethodName = keyof Definition;
type MessageOf<Type> = Type extends { decode(input: Uint8Array): infer Message } ? Message : never;
/** The request of RPC `Name` (its lowerCamelCase name, e.g. 'assembleContext'). */
export type RequestOf<Name extends MethodName> = MessageOf<Definition[Name]['requestType']>;
/** The response of RPC `Name`. */
export type ResponseOf<Name extends MethodName> = MessageOf<Definition[Name]['responseType']>;

export interface CallOptions {
  /** The whole call's deadline, retries included, in milliseconds; null for none. Default: the
   * client's (30 s); a streaming call has none unless given. */
  deadlineMs?: number | null;
  /** Retries of an idempotent call the sidecar was unavailable for. Default: the client's (4). */
  retries?: number;
}

/** The files of a TLS connection to a sidecar that serves `[server.tls]` (PEM, each a path). */
export interface TlsFiles {
  /** The CA certificate(s) the sidecar's certificate must be signed by. */
  caFile: string;
  /** The client's certificate chain, for a sidecar that requires one (mTLS); with `keyFile`. */
  certFile?: string;
  /** The private key of `certFile` (unencrypted). */
  keyFile?: string;
}

export interface ConnectOptions extends CallOptions {
  /** The tenant's bearer token, when the sidecar is configured with tenants. */
  token?: string;
  /** Connect over TLS, trusting `caFile` (and presenting `certFile` under mTLS); unset: plaintext. */
  tls?: TlsFiles;
  /** grpc-js channel options, over the client's own (a fast reconnect backoff). */
  channelOptions?: ChannelOptions;
}

type Methods = {
  [Name in MethodName]: Definition[Name]['responseStream'] extends true
    ? (request?: DeepPartial<RequestOf<Name>>, options?: CallOptions) => ClientReadableStream<ResponseOf<Name>>
    : (request?: DeepPartial<RequestOf<Name>>, options?: CallOptions) => Promise<ResponseOf<Name>>;
};

export interface HealthCheckResponse {
  /** grpc.health.v1's ServingStatus: 1 is SERVING. */
  status: number;
}

export interface SidecarClient extends Methods {
  /** grpc.health.v1.Health/Check: status 1 (SERVING) once the sidecar accepts calls. */
  checkHealth(request?: { service?: string }, options?: CallOptions): Promise<HealthCheckResponse>;
  /** Resolves once the channel is connected (rejects after `deadlineMs`). */
  waitForReady(deadlineMs?: number): Promise<void>;
  close(): void;
}

/** RPC name in the proto -> method name on the client, for the unary RPCs. */
export const METHODS: Readonly<Record<string, string>> = Object.fromEntries(
  Object.entries(ContextSidecarDefinition.methods).filter(([, method]) => !method.responseStream)
    .map(([name, method]) => [method.name, name]));
/** The server-streaming RPCs: their method returns grpc-js's ClientReadableStream ('data' per
 * message, 'error', cancel() to stop), since a promise of one answer cannot carry a stream. */
export const STREAMING_METHODS: Readonly<Record<string, string>> = Object.fromEntries(
  Object.entries(ContextSidecarDefinition.methods).filter(([, method]) => method.responseStream)
    .map(([name, method]) => [method.name, name]));

const SERVICE_PATH = `/${ContextSidecarDefinition.fullName}`;

interface Codec {
  serialize(request: Record<string, unknown>): Buffer;
  deserialize(bytes: Buffer): unknown;
}

// grpc.health.v1: the request's only field is `service` (1, a string); the response's only one
// `status` (1, an enum). Two one-field messages do not warrant a generated file, so they are
// written and read with the protobuf runtime's wire codec (which the generated code uses too).
const HEALTH: Codec = {
  serialize(request) {
    const service = String(request.service ?? '');
    const writer = new BinaryWriter();
    if (service !== '') writer.uint32(10).string(service);
    return Buffer.from(writer.finish());
  },
  deserialize(bytes) {
    const reader = new BinaryReader(bytes);
    let status = 0;
    while (reader.pos < reader.len) {
      const [field, wireType] = reader.tag();
      if (field === 1 && wireType === WireType.Varint) status = reader.int32();
      else reader.skip(wireType, field);
    }
    return { status };
  },
};

function codec(method: Definition[MethodName]): Codec {
  // fromPartial fills every field left out with its zero value, which encode needs.
  const requestType = method.requestType as unknown as {
    fromPartial(request: unknown): unknown; encode(message: unknown): { finish(): Uint8Array } };
  const responseType = method.responseType as unknown as { decode(bytes: Uint8Array): unknown };
  return {
    serialize: (request) => Buffer.from(requestType.encode(requestType.fromPartial(request)).finish()),
    deserialize: (bytes) => responseType.decode(bytes),
  };
}

function readTlsFile(option: keyof TlsFiles, file: unknown): Buffer {
  if (typeof file !== 'string' || file === '') throw new TypeError(`tls.${option} must be a file path`);
  try {
    return fs.readFileSync(file);
  } catch (error) {
    throw new Error(`tls.${option}: cannot read ${file}: ${(error as Error).message}`);
  }
}

/** The channel's credentials: plaintext without `tls`; else TLS with its files read now, so that a
 * missing or unusable file is an error of connect (naming it) rather than of every call. */
function channelCredentials(tls: TlsFiles | undefined): ChannelCredentials {
  if (tls === undefined) return credentials.createInsecure();
  const { caFile, certFile, keyFile } = tls;
  if ((certFile === undefined) !== (keyFile === undefined)) {
    throw new TypeError('tls.certFile and tls.keyFile go together: give both (mTLS) or neither');
  }
  const ca = readTlsFile('caFile', caFile);
  try {
    new X509Certificate(ca); // Node.js's TLS would ignore a CA file holding no certificate
  } catch (error) {
    throw new Error(`tls.caFile: ${caFile} holds no PEM certificate: ${(error as Error).message}`);
  }
  const cert = certFile === undefined ? null : readTlsFile('certFile', certFile);
  const key = keyFile === undefined ? null : readTlsFile('keyFile', keyFile);
  try {
    return credentials.createSsl(ca, key, cert);
  } catch (error) {
    throw new Error(`tls.certFile / tls.keyFile: ${certFile} and ${keyFile} are not a PEM certificate chain and `
      + `its private key: ${(error as Error).message}`);
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * Connect to a sidecar at `address` ("127.0.0.1:50051" or "unix:///abs/path.sock"): plaintext, or
 * TLS with `tls` (the sidecar's `[server.tls]`; its certificate must name the address's host).
 *
 * A call to the sidecar that was unavailable is tried again, up to `retries` times with a
 * doubling pause (0.1 s to 2 s, jittered), when repeating it is harmless (the reads and the
 * writes of what the host names); never past the call's deadline. A failure rejects with a
 * SidecarError subclass by status (InvalidArgumentError, NotFoundError, ...).
 */
export function connect(address: string, options: ConnectOptions = {}): SidecarClient {
  const { token, tls, channelOptions = {}, deadlineMs: clientDeadlineMs = DEFAULT_DEADLINE_MS,
    retries: clientRetries = DEFAULT_RETRIES } = options;
  if (token !== undefined && (typeof token !== 'string' || token === '')) {
    throw new TypeError('token must be a non-empty string');
  }
  const channel = new GrpcClient(address, channelCredentials(tls), { ...CHANNEL_OPTIONS, ...channelOptions });
  // The token as a fresh Metadata per call rather than call credentials, which grpc-js refuses
  // on a plaintext channel: one way for both transports.
  const callMetadata = (): Metadata => {
    const metadata = new Metadata();
    if (token !== undefined) metadata.set('authorization', `Bearer ${token}`);
    return metadata;
  };

  const attempt = (path: string, methodCodec: Codec, request: Record<string, unknown>, deadline: number | null) =>
    new Promise<unknown>((resolve, reject) => {
      channel.makeUnaryRequest(path, methodCodec.serialize, methodCodec.deserialize, request, callMetadata(),
        deadline === null ? {} : { deadline }, (error: ServiceError | null, response?: unknown) =>
          (error ? reject(error) : resolve(response)));
    });

  async function unary(method: string, path: string, methodCodec: Codec, request: Record<string, unknown>,
    callOptions: CallOptions): Promise<unknown> {
    const deadlineMs = callOptions.deadlineMs === undefined ? clientDeadlineMs : callOptions.deadlineMs;
    const deadline = deadlineMs === null ? null : Date.now() + deadlineMs;
    const retries = retryable(method, request) ? callOptions.retries ?? clientRetries : 0;
    for (let retry = 1; ; retry++) {
      try {
        return await attempt(path, methodCodec, request, deadline);
      } catch (error) {
        const serviceError = error as ServiceError;
        const pause = pauseBeforeRetry(serviceError.code, retry, retries, deadline === null ? null : deadline - Date.now());
        if (pause === null) throw callError(method, serviceError);
        await sleep(pause);
      }
    }
  }

  const client: Record<string, unknown> = {
    close: () => channel.close(),
    waitForReady: (deadlineMs = 5000) => new Promise<void>((resolve, reject) => {
      channel.waitForReady(Date.now() + deadlineMs, (error) => (error ? reject(error) : resolve()));
    }),
    checkHealth: (request: { service?: string } = {}, callOptions: CallOptions = {}) =>
      unary('Health/Check', '/grpc.health.v1.Health/Check', HEALTH, request, callOptions),
  };
  for (const [name, method] of Object.entries(ContextSidecarDefinition.methods) as [MethodName, Definition[MethodName]][]) {
    const path = `${SERVICE_PATH}/${method.name}`;
    const methodCodec = codec(method);
    client[name] = method.responseStream
      ? (request: Record<string, unknown> = {}, callOptions: CallOptions = {}) => {
        const call = channel.makeServerStreamRequest(path, methodCodec.serialize, methodCodec.deserialize, request,
          callMetadata(), callOptions.deadlineMs == null ? {} : { deadline: Date.now() + callOptions.deadlineMs });
        // The stream's 'error' is the SidecarError a unary call would reject with.
        const emit = call.emit.bind(call);
        call.emit = ((event: string | symbol, ...args: unknown[]) => (event === 'error'
          ? emit(event, callError(method.name, args[0] as ServiceError)) : emit(event, ...args))) as typeof call.emit;
        return call;
      }
      : (request: Record<string, unknown> = {}, callOptions: CallOptions = {}) =>
        unary(method.name, path, methodCodec, request, callOptions);
  }
  return client as unknown as SidecarClient;
}
