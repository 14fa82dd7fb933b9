'use strict';

// Integration test: what each AssembleContext answer says the provider's prompt cache will do,
// through client.js against a real sidecar with the "chars" counter. stable_prefix_tokens and
// break_at are recounted here from two consecutive renderings alone: the requests' parts (the
// static prefix, the per-task messages, each input item) compared in order, and the common ones
// counted as the provider counts them: their texts as code points, and FRAMING tokens around
// each block. RecordUsage sets the provider's cached figures against that prediction.

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const { connect } = require('../client');
const { startSidecar, killSidecar, stopWithSigterm } = require('./sidecar');
const { codePoints } = require('./text');

const RUN_ID = 'node-cache';
const TURNS = 8;
const FLAGS = ['--token-counter', 'chars', '--transcript-token-budget', '20000'];
// What a provider adds around each block of a rendering (a tool, the instructions, an input item):
// its role and type markers, as the sidecar estimates them (docs/transcript.md).
const FRAMING = 4;

const SCHEMA = { type: 'object', properties: { q: { type: 'string' } } };
const PROFILE = {
  system_prompt: 'You answer refund questions. ✅',
  tools: [{ name: 'search', description: 'Search the docs.', parameters_json: JSON.stringify(SCHEMA) }],
};
const TASK = { task_id: 'refunds', goal: 'Find the refund window.', plan: '1. search\n2. answer' };

// The canonical tool list the sidecar counts: sorted by name, keys sorted at every level.
function canonical(value) {
  if (Array.isArray(value)) return `[${value.map(canonical).join(',')}]`;
  if (value && typeof value === 'object') {
    return `{${Object.keys(value).sort().map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`).join(',')}}`;
  }
  return JSON.stringify(value);
}
const TOOLS_TOKENS = codePoints(canonical(PROFILE.tools.map((t) => (
  { name: t.name, description: t.description, parameters: JSON.parse(t.parameters_json) }))));

function turnEvents(i) {
  const events = [{ event_id: `u${i}`, role: 'user', content: `question ${i}: ${'é'.repeat(i)}` }];
  for (let k = 0; k < i % 3; k++) {
    events.push({ event_id: `c${i}.${k}`, role: 'assistant', type: 'tool_call', call_id: `k${i}_${k}`,
      tool_name: 'search', content: JSON.stringify({ q: `q${i}.${k}` }) });
    events.push({ event_id: `r${i}.${k}`, role: 'tool', type: 'tool_result', call_id: `k${i}_${k}`,
      content: `result ${i}.${k} ${'x'.repeat(10 * i)}` });
  }
  events.push({ event_id: `a${i}`, role: 'assistant', content: `answer ${i}` });
  return events;
}

// The texts an input item carries.
function texts(item) {
  if (item.type === 'message') return [item.content];
  if (item.type === 'function_call') return [item.arguments];
  if (typeof item.output === 'string') return [item.output];
  return item.output.map((part) => part.text);
}

// The request as parts: [key, tokens]. The static prefix is instructions (the static sections
// joined by a blank line, as sent), the tools (the canonical list's count, each tool a block) and
// the prompt cache key. A missing result's placeholder is sent, so counted.
function parts(answer) {
  const body = JSON.parse(answer.rendered);
  const prefixTokens = codePoints(body.instructions) + FRAMING + TOOLS_TOKENS + FRAMING * body.tools.length;
  const out = [[JSON.stringify([body.instructions, body.tools, body.prompt_cache_key]), prefixTokens]];
  for (const item of body.input) {
    out.push([JSON.stringify(item), texts(item).reduce((sum, t) => sum + codePoints(t), FRAMING)]);
  }
  return out;
}

function requestTokens(answer) {
  return parts(answer).reduce((sum, [, tokens]) => sum + tokens, 0);
}

function recount(before, after) {
  const old = parts(before);
  const now = parts(after);
  let at = 0;
  while (at < Math.min(old.length, now.length) && old[at][0] === now[at][0]) at++;
  return { stable: now.slice(0, at).reduce((sum, [, tokens]) => sum + tokens, 0), at };
}

describe('the prompt cache report over gRPC (Node.js client)', () => {
  let tmpDir;
  let sidecar;
  let client;
  const answers = [];

  before(async () => {
    tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'cs-node-cache-'));
    sidecar = startSidecar(tmpDir, FLAGS);
    client = connect(await sidecar.ready);
    await client.openRun({ run_id: RUN_ID, profile: PROFILE, task: TASK });
  });

  after(async () => {
    if (client) client.close();
    await killSidecar(sidecar);
    if (tmpDir) fs.rmSync(tmpDir, { recursive: true, force: true });
  });

  it('reports the previous request as stable, recounted from two consecutive renderings', async () => {
    for (let i = 1; i <= TURNS; i++) {
      const answer = await client.assembleContext({ run_id: RUN_ID, iteration: i, append_events: turnEvents(i),
        render: 'openai_responses' });
      if (i === 1) {
        assert.deepEqual(answer.cache, { stable_prefix_tokens: 0, break_at: 0, break_reason: 'first_turn',
          request_tokens: requestTokens(answer) });
      } else {
        const previous = answers[answers.length - 1];
        const { stable, at } = recount(previous, answer);
        assert.equal(answer.cache.stable_prefix_tokens, stable, `turn ${i}: stable tokens`);
        assert.equal(answer.cache.break_at, at, `turn ${i}: break_at`);
        assert.equal(answer.cache.break_reason, '', `turn ${i}: nothing broke`);
        assert.equal(stable, requestTokens(previous), `turn ${i}: the whole previous request repeats`);
        assert.equal(answer.cache.request_tokens, requestTokens(answer), `turn ${i}: the request's tokens`);
        assert.equal(at, parts(previous).length);
      }
      answers.push(answer);
    }
  });

  it('names the break when the task changes, and still recounts', async () => {
    await client.updateTask({ run_id: RUN_ID, task: { task_id: 'refunds', goal: 'Quote the clause.' } });
    const answer = await client.assembleContext({ run_id: RUN_ID, iteration: TURNS + 1,
      append_events: turnEvents(TURNS + 1), render: 'openai_responses' });
    const { stable, at } = recount(answers[answers.length - 1], answer);
    assert.equal(answer.cache.break_reason, 'task_changed');
    assert.equal(at, 1, 'the first per-task message differs');
    assert.equal(answer.cache.break_at, at);
    assert.equal(answer.cache.stable_prefix_tokens, stable);
    answers.push(answer);
  });

  it('sets the provider cached figures against the prediction', async () => {
    const last = answers[answers.length - 1];
    const usage = await client.recordUsage({ run_id: RUN_ID, iteration: last.iteration, input_tokens: 40,
      cache_read_input_tokens: 300, cache_creation_input_tokens: 25, output_tokens: 7 });
    assert.equal(usage.predicted_cached_tokens, last.cache.stable_prefix_tokens);
    assert.equal(usage.reported_cached_tokens, 300);
    assert.equal(usage.drift_tokens, 40 + 300 + 25 - last.window_tokens);
    const state = await client.getState({ run_id: RUN_ID });
    assert.equal(state.last_usage.predicted_cached_tokens, usage.predicted_cached_tokens);
  });

  it('stops cleanly on SIGTERM', async () => {
    client.close();
    client = null;
    await stopWithSigterm(sidecar);
  });
});
