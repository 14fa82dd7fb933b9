'use strict';

// A thin promise-based client for the context sidecar (contextsidecar.v1.ContextSidecar).
// The proto is loaded at runtime from the repository, so this client can never drift from it.

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_PATH = path.join(__dirname, '..', '..', 'proto', 'contextsidecar', 'v1', 'sidecar.proto');

// keepCase: field names stay as in the proto (run_id, not runId), matching the docs.
// longs: Number: every count is int32, so Number is exact.
// defaults + oneofs: unset plain fields read as their zero value, while a proto3 `optional`
// field that was not sent stays absent (undefined), so "unset" and "0" remain distinguishable
// (e.g. ListRunEventsResponse.next_from_seq is absent on the last page).
const LOADER_OPTIONS = { keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true };

let cachedService = null;

function loadService() {
  if (cachedService === null) {
    const definition = protoLoader.loadSync(PROTO_PATH, LOADER_OPTIONS);
    cachedService = grpc.loadPackageDefinition(definition).contextsidecar.v1.ContextSidecar;
  }
  return cachedService;
}

// RPC name in the proto -> wrapper name on the client.
const METHODS = {
  OpenRun: 'openRun',
  AppendEvents: 'appendEvents',
  ListRunEvents: 'listRunEvents',
  AssembleContext: 'assembleContext',
  GetTranscriptWindow: 'getTranscriptWindow',
  CountTokens: 'countTokens',
  GetCapabilities: 'getCapabilities',
  RecordSummary: 'recordSummary',
  GetArtifact: 'getArtifact',
  DeleteArtifact: 'deleteArtifact',
  ForkRun: 'forkRun',
  DeleteRun: 'deleteRun',
  PutMemory: 'putMemory',
  GetMemory: 'getMemory',
  DeleteMemory: 'deleteMemory',
  ListMemory: 'listMemory',
  RegisterSecrets: 'registerSecrets',
  ForgetSecrets: 'forgetSecrets',
  CompactMemory: 'compactMemory',
  ListMemoryEvents: 'listMemoryEvents',
  UpdateProfile: 'updateProfile',
  UpdateTask: 'updateTask',
  LoadSkill: 'loadSkill',
  UnloadSkill: 'unloadSkill',
  PutStateData: 'putStateData',
  GetState: 'getState',
  RecordUsage: 'recordUsage',
  ListCompactionRecords: 'listCompactionRecords',
};

// Server-streaming RPCs: the wrapper returns the grpc-js ClientReadableStream itself ('data' per
// message, 'error' with a ServiceError, cancel() to stop), since a promise of one response
// cannot carry a stream that runs until the caller cancels.
const STREAMING_METHODS = {
  WatchEvents: 'watchEvents',
};

/**
 * Connect to a sidecar at `address` ("unix:///abs/path.sock" or "127.0.0.1:50051").
 * The sidecar has no TLS of its own (it listens on loopback or a unix socket), hence insecure.
 *
 * `token`: when the sidecar is configured with tenants, the tenant's bearer token. Every call
 * then carries the metadata `authorization: Bearer <token>` (a fresh grpc.Metadata per call;
 * grpc-js refuses call credentials on an insecure channel). Without a token no metadata is sent,
 * which is what a sidecar without tenants expects.
 *
 * Every wrapper takes the request object and optional { deadlineMs } and returns a promise of
 * the response; a failure rejects with the grpc-js ServiceError (its .code is a grpc.status).
 * A streaming wrapper (STREAMING_METHODS) returns the call's readable stream instead.
 */
function connect(address, { channelOptions = {}, token } = {}) {
  if (token != null && (typeof token !== 'string' || token === '')) {
    throw new TypeError('token must be a non-empty string');
  }
  const Service = loadService();
  const stub = new Service(address, grpc.credentials.createInsecure(), channelOptions);
  const callMetadata = () => {
    const metadata = new grpc.Metadata();
    if (token != null) metadata.set('authorization', `Bearer ${token}`);
    return metadata;
  };

  const client = {
    close: () => stub.close(),
    // For callers that want to wait for the channel before the first call.
    waitForReady(deadlineMs = 5000) {
      return new Promise((resolve, reject) => {
        stub.waitForReady(Date.now() + deadlineMs, (err) => (err ? reject(err) : resolve()));
      });
    },
  };
  for (const [rpc, name] of Object.entries(METHODS)) {
    client[name] = (request = {}, { deadlineMs = 30000 } = {}) =>
      new Promise((resolve, reject) => {
        stub[rpc](request, callMetadata(), { deadline: Date.now() + deadlineMs }, (err, response) =>
          err ? reject(err) : resolve(response));
      });
  }
  for (const [rpc, name] of Object.entries(STREAMING_METHODS)) {
    // No deadline by default: a watch runs until the caller cancels it.
    client[name] = (request = {}, { deadlineMs } = {}) =>
      stub[rpc](request, callMetadata(), deadlineMs == null ? {} : { deadline: Date.now() + deadlineMs });
  }
  return client;
}

module.exports = { connect, loadService, METHODS, STREAMING_METHODS, PROTO_PATH, LOADER_OPTIONS, status: grpc.status };
