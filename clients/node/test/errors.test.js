// The client's errors and retries against a real sidecar: a class per status carrying the
// sidecar's reason, bad fields and ErrorInfo metadata; an unavailable sidecar retried for the
// calls whose repeat is harmless (the Python client's rules), never for the others, never past
// the call's deadline.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { connect, DeadlineExceededError, FailedPreconditionError, InvalidArgumentError, NotFoundError, SidecarError, status,
  UnavailableError } from '@context-sidecar/client';
import { startSidecar, killSidecar, stopWithSigterm } from './sidecar.js';
import { rejection } from './assertions.js';

describe('errors and retries (Node.js client)', () => {
  let tmpDir;
  let sidecar;
  let client;

  before(() => {
    tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'sidecar-errors-'));
  });

  after(async () => {
    if (client) client.close();
    await killSidecar(sidecar); // only if a failure skipped the clean stop below
    if (tmpDir) fs.rmSync(tmpDir, { recursive: true, force: true });
  });

  it('retries an idempotent call until the sidecar is up, and never a delete', async () => {
    // The sidecar is not started yet: its socket does not exist.
    const address = `unix://${path.join(tmpDir, 'sidecar.sock')}`;
    client = connect(address, { retries: 30 });
    // A deadline that outlasts the sidecar's start on a loaded machine; the outcome is kept at
    // once (a rejection is a value here), so it is never an unhandled one while the test waits.
    const capabilities = client.getCapabilities({}, { deadlineMs: 120_000 }).catch((error) => error);
    const deleted = await rejection(client.deleteRun({ run_id: 'nothing' }));
    assert.ok(deleted instanceof UnavailableError, `a delete is not retried: ${deleted}`);
    assert.equal(deleted.code, status.UNAVAILABLE);
    assert.equal(deleted.reason, '', 'the call never reached a sidecar');
    assert.equal(deleted.method, 'DeleteRun');
    sidecar = startSidecar(tmpDir);
    assert.equal(await sidecar.ready, address);
    const answer = await capabilities;
    assert.ok(!(answer instanceof Error), `the retried call failed: ${answer}`);
    assert.ok(JSON.parse(answer.capabilities_json).contextWindow, 'the retried call answered once the sidecar was up');
  });

  it('gives up at the call\'s deadline', async () => {
    const absent = connect(`unix://${path.join(tmpDir, 'absent.sock')}`, { retries: 30 });
    try {
      const started = Date.now();
      const error = await rejection(absent.getCapabilities({}, { deadlineMs: 400 }));
      assert.ok(error instanceof SidecarError, `${error}`);
      assert.ok([status.UNAVAILABLE, status.DEADLINE_EXCEEDED].includes(error.code), `${error}`);
      // Retries never sleep past the deadline: far less than 30 retries' pauses (over 40 s).
      assert.ok(Date.now() - started < 5000, `gave up after ${Date.now() - started} ms`);
    } finally {
      absent.close();
    }
  });

  it('raises a class per status with the reason and the bad fields', async () => {
    const invalid = await rejection(client.countTokens({ token_counter: 'bpe', texts: ['hi'] }));
    assert.ok(invalid instanceof InvalidArgumentError && invalid instanceof SidecarError && invalid instanceof Error);
    assert.equal(invalid.name, 'InvalidArgumentError');
    assert.equal(invalid.code, status.INVALID_ARGUMENT);
    assert.equal(invalid.reason, 'validation_error');
    assert.deepEqual(invalid.fieldViolations.map((violation) => violation.field), ['token_counter']);
    assert.ok(invalid.fieldViolations[0].description.includes('is not a token counter'), invalid.fieldViolations[0].description);
    assert.ok(invalid.details.includes('token_counter'), invalid.details);
    assert.match(invalid.message, /^CountTokens: INVALID_ARGUMENT \(validation_error\): token_counter/);

    const missing = await rejection(client.getTranscriptWindow({ run_id: 'no-such-run', iteration: 1 }));
    assert.ok(missing instanceof NotFoundError, `${missing}`);
    assert.equal(missing.reason, 'not_found');
    assert.deepEqual(missing.fieldViolations, []);
  });

  it('carries the ErrorInfo metadata', async () => {
    await client.openRun({ run_id: 'narrow', token_counter: 'chars', transcript_token_budget: 1000, transcript_window: 2 });
    const events = ['a', 'b', 'c'].map((id) => ({ event_id: id, role: 'user', content: `event ${id}` }));
    const refused = await rejection(client.assembleContext({ run_id: 'narrow', iteration: 1, append_events: events }));
    assert.ok(refused instanceof FailedPreconditionError, `${refused}`);
    assert.equal(refused.reason, 'transcript_window_exceeded');
    assert.deepEqual(refused.info, { events_needed: '3', transcript_window: '2' });
    const { events: stored } = await client.listRunEvents({ run_id: 'narrow' });
    assert.deepEqual(stored, [], 'the refused call wrote nothing');
  });

  it('gives a watch\'s failure as the same error classes', async () => {
    // A watch runs until cancelled: one with a short deadline fails once it passes.
    const watch = client.watchEvents({}, { deadlineMs: 300 });
    const failure = await new Promise((resolve) => {
      watch.on('error', resolve);
      watch.on('data', () => {});
    });
    assert.ok(failure instanceof DeadlineExceededError, `${failure}`);
    assert.equal(failure.code, status.DEADLINE_EXCEEDED);
    assert.equal(failure.method, 'WatchEvents');
  });

  it('stops cleanly on SIGTERM', async () => {
    client.close();
    client = null;
    await stopWithSigterm(sidecar);
  });
});
