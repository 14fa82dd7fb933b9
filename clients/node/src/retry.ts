// Which calls may be tried again, and the pause before each retry: the Python client's rules
// (clients/python/context_sidecar_client/calls.py), so a host gets the same behaviour in either language.

import { status } from '@grpc/grpc-js';

export const DEFAULT_DEADLINE_MS = 30_000; // the whole call with its retries
export const DEFAULT_RETRIES = 4; // after the first attempt: up to 1.5 s of pauses, enough for a restart
const FIRST_PAUSE_MS = 100;
const LONGEST_PAUSE_MS = 2000; // doubling per retry, each drawn from [half, whole]

// A sidecar restarted on loopback is back in well under a second: grpc's default first
// reconnect backoff (1 s) would fail every retry within it at once, without trying to connect.
export const CHANNEL_OPTIONS = {
  'grpc.initial_reconnect_backoff_ms': 100,
  'grpc.max_reconnect_backoff_ms': 2000,
} as const;

// UNAVAILABLE may come after the sidecar did the work and before its answer arrived, so only a
// call whose repeat leaves what one call leaves, and answers without an error, is tried again:
// the reads; the writes of things the host names, which the sidecar answers a second time as
// already done; the writes that replace a value with the same one. Never retried: the deletes
// and UnloadSkill (a repeat answers NOT_FOUND for what the first attempt removed), WatchEvents.
const IDEMPOTENT = new Set([
  'Health/Check', 'OpenRun', 'AppendEvents', 'ListRunEvents', 'AssembleContext', 'GetTranscriptWindow',
  'CountTokens', 'GetCapabilities', 'RecordSummary', 'GetArtifact', 'ForkRun', 'GetMemory', 'ListMemory',
  'RegisterSecrets', 'ForgetSecrets', 'UpdateProfile', 'UpdateTask', 'LoadSkill', 'PutStateData', 'GetState',
  'RecordUsage', 'ListCompactionRecords', 'ListMemoryEvents',
]);
// Idempotent only when the request names what it writes: without entry_id each PutMemory makes a
// new entry; without source_ids each CompactMemory distils whatever the oldest entries are then.
const IDEMPOTENT_WHEN: Record<string, (request: Record<string, unknown>) => boolean> = {
  PutMemory: (request) => Boolean(request.entry_id),
  CompactMemory: (request) => Array.isArray(request.source_ids) && request.source_ids.length > 0,
};

export function retryable(method: string, request: Record<string, unknown>): boolean {
  return IDEMPOTENT.has(method) || (IDEMPOTENT_WHEN[method]?.(request) ?? false);
}

/** Milliseconds to wait before retry number `retry` (1-based) of a failed attempt, or null: give
 * up. Only UNAVAILABLE is retried, and never past the call's deadline (`remainingMs`). */
export function pauseBeforeRetry(code: status, retry: number, retries: number, remainingMs: number | null): number | null {
  if (code !== status.UNAVAILABLE || retry > retries) return null;
  const pause = Math.min(LONGEST_PAUSE_MS, FIRST_PAUSE_MS * 2 ** (retry - 1)) * (0.5 + Math.random() / 2);
  if (remainingMs !== null && pause >= remainingMs) return null;
  return pause;
}
