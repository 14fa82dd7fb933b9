// grpc.health.v1 through the client's checkHealth: the whole server and a named service answer
// SERVING, and a service the sidecar does not have is NOT_FOUND whatever its name's length
// (a name of 128 bytes or more takes a two-byte length on the wire).

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { connect, NotFoundError } from '@context-sidecar/client';
import { startSidecar, killSidecar } from './sidecar.js';
import { rejection } from './assertions.js';

const SERVING = 1;

describe('health (Node.js client)', () => {
  let tmpDir;
  let sidecar;
  let client;

  before(async () => {
    tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'sidecar-health-'));
    sidecar = startSidecar(tmpDir);
    client = connect(await sidecar.ready);
  });

  after(async () => {
    if (client) client.close();
    await killSidecar(sidecar);
    if (tmpDir) fs.rmSync(tmpDir, { recursive: true, force: true });
  });

  it('answers SERVING for the server and for the sidecar service by name', async () => {
    assert.equal((await client.checkHealth()).status, SERVING);
    assert.equal((await client.checkHealth({ service: 'contextsidecar.v1.ContextSidecar' })).status, SERVING);
  });

  for (const length of [5, 127, 128, 300]) {
    it(`answers NOT_FOUND for an unknown service named in ${length} bytes`, async () => {
      const error = await rejection(client.checkHealth({ service: 'x'.repeat(length) }));
      assert.ok(error instanceof NotFoundError, `expected NotFoundError, got ${error}`);
    });
  }
});
