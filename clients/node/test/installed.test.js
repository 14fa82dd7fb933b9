// The package as a user gets it: `npm pack`, the tarball installed into a fresh project outside
// the repository, the docs' examples (examples/one_turn.ts, examples/ai_sdk.ts) compiled there
// with `tsc --strict`, and run against a real sidecar. The tarball is packed from the build
// (`npm run build`, which dev.sh runs before the tests).

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import util from 'node:util';

import { connect } from '@context-sidecar/client';
import { startSidecar, killSidecar, stopWithSigterm } from './sidecar.js';

const PACKAGE = path.join(import.meta.dirname, '..');
// The fresh project takes the versions this package is developed and tested with.
const versionOf = (name) => JSON.parse(fs.readFileSync(path.join(PACKAGE, 'node_modules', name, 'package.json'), 'utf8')).version;
const HOST_DEPENDENCIES = ['typescript', '@types/node', 'ai', '@ai-sdk/provider'].map((name) => `${name}@${versionOf(name)}`);
// The sidecar has a tenant, as in production: the examples take its token from $SIDECAR_TOKEN.
const TOKEN = crypto.randomBytes(16).toString('hex');
const TSC = ['--strict', '--module', 'nodenext', '--target', 'es2022', '--types', 'node'];

function run(command, args, options) {
  try {
    return execFileSync(command, args, { encoding: 'utf8', stdio: 'pipe', ...options });
  } catch (error) {
    throw new Error(`${command} ${args.join(' ')} failed:\n${error.stdout}\n${error.stderr}`);
  }
}

describe('the packed package, installed into a fresh project', () => {
  let tmpDir;
  let host; // the fresh project
  let sidecar;
  let client;

  before(async () => {
    tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'sidecar-npm-'));
    host = path.join(tmpDir, 'host');
    fs.mkdirSync(host);
    const config = path.join(tmpDir, 'sidecar.toml');
    const tokenSha256 = crypto.createHash('sha256').update(TOKEN, 'utf8').digest('hex');
    fs.writeFileSync(config, `[[auth.tenants]]\nid = "host"\ntoken_sha256 = "${tokenSha256}"\n`);
    sidecar = startSidecar(tmpDir, ['--config', config]);
    const [packed] = JSON.parse(run('npm', ['pack', '--json', '--ignore-scripts', '--pack-destination', tmpDir], { cwd: PACKAGE }));
    fs.writeFileSync(path.join(host, 'package.json'), JSON.stringify({ name: 'host', private: true, type: 'module' }));
    run('npm', ['install', '--no-audit', '--no-fund', '--prefer-offline', '--loglevel=error',
      path.join(tmpDir, packed.filename), ...HOST_DEPENDENCIES], { cwd: host });
    for (const example of ['one_turn.ts', 'ai_sdk.ts']) {
      fs.copyFileSync(path.join(PACKAGE, 'examples', example), path.join(host, example));
    }
    client = connect(await sidecar.ready, { token: TOKEN });
  });

  after(async () => {
    if (client) client.close();
    await killSidecar(sidecar); // only if a failure skipped the clean stop below
    if (tmpDir) fs.rmSync(tmpDir, { recursive: true, force: true });
  });

  it('ships the build, its types and the contract, and nothing of the repository', () => {
    const installed = path.join(host, 'node_modules', '@context-sidecar', 'client');
    for (const file of ['dist/index.js', 'dist/index.d.ts', 'dist/ai-sdk.d.ts', 'proto/contextsidecar/v1/sidecar.proto',
      'proto/google/rpc/status.proto', 'proto/google/rpc/error_details.proto']) {
      assert.ok(fs.existsSync(path.join(installed, file)), file);
    }
    assert.equal(fs.existsSync(path.join(installed, 'test')), false, 'no tests in the package');
  });

  it('compiles the one-turn example with tsc --strict and runs it, with a tenant\'s token', async () => {
    run(path.join(host, 'node_modules', '.bin', 'tsc'), [...TSC, 'one_turn.ts'], { cwd: host });
    const printed = run('node', ['one_turn.js'], { cwd: host,
      env: { ...process.env, SIDECAR_ADDRESS: sidecar.address, SIDECAR_TOKEN: TOKEN } });
    // What it printed is what the sidecar recorded as fed for the turn, counted again here.
    const fed = await client.getTranscriptWindow({ run_id: 'run-1', iteration: 1 });
    assert.deepEqual(fed.event_ids, ['u1', 'c1', 'r1']);
    const { counts } = await client.countTokens({ token_counter: 'o200k_base', texts: fed.entries.map((e) => e.rendered) });
    assert.deepEqual(fed.entries.map((e) => e.tokens), counts);
    assert.equal(printed, [...fed.entries.map((e, i) => `${e.event_id} ${counts[i]} tokens`),
      'INVALID_ARGUMENT validation_error', 'events[0].event_id is required', ''].join('\n'));
  });

  it('compiles the AI SDK example with tsc --strict and runs a chat on the SDK\'s mock model', async () => {
    // --skipLibCheck: the AI SDK's own declarations import json-schema's types, which it does not bring.
    run(path.join(host, 'node_modules', '.bin', 'tsc'), [...TSC, '--skipLibCheck', 'ai_sdk.ts'], { cwd: host });
    fs.writeFileSync(path.join(host, 'chat.js'), `
import { MockLanguageModelV3 } from 'ai/test';
import { connect } from '@context-sidecar/client';
import { chat } from './ai_sdk.js';
const sidecar = connect(process.env.SIDECAR_ADDRESS, { token: process.env.SIDECAR_TOKEN });
const model = new MockLanguageModelV3({ doGenerate: { content: [{ type: 'text', text: 'Within 30 days.' }],
  finishReason: { unified: 'stop' }, warnings: [],
  usage: { inputTokens: { total: 1 }, outputTokens: { total: 1 } } } });
const question = { role: 'user', content: 'What does the refund policy say?' };
const answer = await chat(sidecar, model, [question]);
await chat(sidecar, model, [question, ...answer, { role: 'user', content: 'And for a kettle?' }]);
console.log(JSON.stringify(model.doGenerateCalls.map((call) => call.prompt)));
sidecar.close();
`);
    const prompts = JSON.parse(run('node', ['chat.js'], { cwd: host,
      env: { ...process.env, SIDECAR_ADDRESS: sidecar.address, SIDECAR_TOKEN: TOKEN } }));
    const system = { role: 'system', content: 'You are a helpful assistant.' };
    const user = (text) => ({ role: 'user', content: [{ type: 'text', text }] });
    assert.deepEqual(prompts, [
      [system, user('What does the refund policy say?')],
      [system, user('What does the refund policy say?'), { role: 'assistant', content: [{ type: 'text', text: 'Within 30 days.' }] },
        user('And for a kettle?')],
    ]);
    const fed = await client.getTranscriptWindow({ run_id: 'chat-1', iteration: 2 });
    assert.deepEqual(fed.entries.map((entry) => entry.rendered), ['What does the refund policy say?', 'Within 30 days.', 'And for a kettle?']);
  });

  it('stops cleanly on SIGTERM', async () => {
    client.close();
    client = null;
    await stopWithSigterm(sidecar);
  });
});
