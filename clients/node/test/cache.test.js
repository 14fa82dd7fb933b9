// Integration test: what each AssembleContext answer says the provider's prompt cache will do,
// through client.js against a real sidecar with the "chars" counter. stable_prefix_tokens and
// break_at are recounted here from two consecutive renderings alone: the requests' parts (the
// static prefix, the per-task messages, each input item) compared in order, and the common ones
// counted as the provider counts them: their texts as code points, and FRAMING tokens around
// each block. RecordUsage sets the provider's cached figures against that prediction.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { connect } from '@context-sidecar/client';
import { startSidecar, killSidecar, stopWithSigterm } from './sidecar.js';
import { codePoints, fedText } from './text.js';

const RUN_ID = 'node-cache';
const TURNS = 8;
// The clearing settings are the clearing run's (below); the first run's turns never reach them.
const FLAGS = ['--token-counter', 'chars', '--transcript-token-budget', '20000', '--trim-to-fraction', '0.6',
  '--clearing-enabled', '--clearing-trigger-fraction', '0.8', '--clearing-keep-recent', '1',
  '--clearing-clear-at-least-tokens', '400'];
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

// The clearing run: a turn of a 20-character question, a call, its 320-character result and a
// 20-character answer, the same sizes every turn so that the documented rules
// (docs/transcript.md: "The window: cheap by default", "The recent turns") fix the numbers. Its
// budget is 2,000; trim_to_fraction 0.6 makes the recent turns the last keep_last_turns (2) and
// the older whole turns that fit with them in 1,200 tokens; a clearing is considered once the
// transcript fed from the window's start passes 0.8 of the budget (1,600), frees at least 400
// and keeps the newest keep_recent (1) result. A result is fed as 452 code points in the
// untrusted-data block, a turn as 502: turns 1-3 weigh 1,506, under the trigger; turn 4 brings
// 2,008, past it (and past the budget, so the clearing is what keeps the start put). Its recent
// turns are turns 3 and 4 (1,004; with turn 2, 1,506 is over 1,200), so the results older than
// them are turns 1 and 2's, each freeing 339 as its 113-code-point placeholder: one is less
// than 400, both are more. So turn 4 clears exactly r1 and r2; turn 5 could free only r3's 339.
const CLEARING = { runId: 'node-cache-clearing', budget: 2000, keepLastTurns: 2, trigger: 1600, turn: 4,
  cleared: ['r1', 'r2'] };

function clearingTurn(i) {
  const padded = (text, length) => text.padEnd(length, '.');
  return [
    { event_id: `u${i}`, role: 'user', content: padded(`question ${i}`, 20) },
    { event_id: `c${i}`, role: 'assistant', type: 'tool_call', call_id: `k${i}`, tool_name: 'search',
      content: JSON.stringify({ q: `q${i}` }) },
    { event_id: `r${i}`, role: 'tool', type: 'tool_result', call_id: `k${i}`,
      content: padded(`rows of result ${i}: `.repeat(20), 320).slice(0, 320) },
    { event_id: `a${i}`, role: 'assistant', content: padded(`answer ${i}`, 20) },
  ];
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

  it('clears old tool results at the turn the rules say, and names the break', async () => {
    const { runId, budget, keepLastTurns, trigger, turn: clearingAt, cleared } = CLEARING;
    await client.openRun({ run_id: runId, token_counter: 'chars', transcript_token_budget: budget,
      keep_last_turns: keepLastTurns });
    const block = JSON.parse((await client.getCapabilities({})).capabilities_json).contextWindow.untrustedBlock;
    const fedTokens = new Map(); // event id -> what it weighs fed whole
    let transcript = 0;
    let nextSeq = 0;
    let previous;
    for (let i = 1; i <= clearingAt + 1; i++) {
      const events = clearingTurn(i);
      for (const event of events) {
        fedTokens.set(event.event_id, codePoints(fedText(event, block)));
        transcript += fedTokens.get(event.event_id);
      }
      const where = `turn ${i}`;
      // The workload is as designed: the transcript passes the trigger first at turn 4.
      if (i <= clearingAt) assert.equal(transcript > trigger, i === clearingAt, `${where}: ${transcript} tokens`);
      const answer = await client.assembleContext({ run_id: runId, iteration: i, append_events: events });
      // A turn that cleared wrote its context.cleared entry after its events: one seq more.
      assert.deepEqual(answer.appended.map((a) => [a.event_id, a.seq, a.tokens]),
        events.map((e, k) => [e.event_id, nextSeq + k, fedTokens.get(e.event_id)]), `${where}: appended`);
      nextSeq += events.length + (i === clearingAt ? 1 : 0);
      const placeholders = answer.entries.filter((e) => e.clipped_from_tokens > 0);
      const newly = placeholders.filter((e) => !(previous?.entries ?? []).some((p) => p.event_id === e.event_id &&
        p.clipped_from_tokens > 0));
      if (i < clearingAt) {
        assert.deepEqual(placeholders, [], `${where}: nothing cleared before the transcript passes the trigger`);
        assert.equal(answer.cache.break_reason, i === 1 ? 'first_turn' : '', `${where}: nothing broke`);
      } else if (i === clearingAt) {
        assert.deepEqual(newly.map((e) => e.event_id), cleared, `${where}: the results older than the recent turns`);
        for (const entry of newly) {
          const tokens = fedTokens.get(entry.event_id);
          const text = `[tool result cleared to save context: tool search, call_id ${JSON.stringify(entry.call_id)}, ` +
            `${tokens} tokens; call the tool again if it is needed]`;
          const { type, text: fed, tokens: counted, clipped_from_tokens: clipped } = entry;
          assert.deepEqual({ type, text: fed, tokens: counted, clipped },
            { type: 'tool_result', text, tokens: codePoints(text), clipped: tokens }, `${where}: ${entry.event_id}`);
        }
        // The break is at the first cleared result (part 0 is the static prefix: no task here),
        // the entries before it repeated.
        const at = answer.entries.findIndex((e) => e.event_id === cleared[0]);
        assert.deepEqual(answer.cache, { stable_prefix_tokens: answer.entries.slice(0, at)
          .reduce((sum, e) => sum + e.tokens, 0), break_at: 1 + at, break_reason: 'tool_results_cleared',
        request_tokens: answer.token_count }, `${where}: the cache report`);
        assert.equal(answer.omitted_events, 0, `${where}: the start stays put`);
      } else {
        assert.deepEqual(newly, [], `${where}: one clearing, then room for a turn`);
        assert.deepEqual(placeholders.map((e) => e.event_id), cleared, `${where}: cleared results stay cleared`);
        assert.equal(answer.cache.break_reason, '', `${where}: nothing broke`);
      }
      previous = answer;
    }
    // The clearing is the sidecar's own log entry, listed as a compaction record.
    const { records } = await client.listCompactionRecords({ run_id: runId });
    const placeholderTokens = previous.entries.filter((e) => cleared.includes(e.event_id))
      .reduce((sum, e) => sum + e.tokens, 0);
    assert.deepEqual(records.map((r) => ({ kind: r.kind, iteration: r.iteration, removed: r.removed_event_ids,
      before: r.tokens_before, after: r.tokens_after, seq: r.seq })), [{ kind: 'cleared', iteration: clearingAt,
      removed: cleared, before: cleared.reduce((sum, id) => sum + fedTokens.get(id), 0), after: placeholderTokens,
      seq: 4 * clearingAt }]);
    const [entry] = (await client.listRunEvents({ run_id: runId, from_seq: 4 * clearingAt, limit: 1 })).events;
    assert.equal(entry.type, 'context.cleared');
  });

  it('stops cleanly on SIGTERM', async () => {
    client.close();
    client = null;
    await stopWithSigterm(sidecar);
  });
});
