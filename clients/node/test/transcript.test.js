// Integration test: a real sidecar process, driven turn by turn through client.js.
//
// Every number the sidecar reports is recounted here, independently: with the "chars" counter
// a text's tokens are its Unicode code points, i.e. [...text].length in JavaScript (not
// text.length, which counts UTF-16 units). The window rules are checked against our own
// record of every event we sent, never against the server's view of the log.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { connect, status } from '@context-sidecar/client';
import { startSidecar, killSidecar, stopWithSigterm } from './sidecar.js';
import { assertStatus, assertReason, rejection } from './assertions.js';

const BUDGET = 2000;
const TURNS = 40;
const RUN_ID = 'node-transcript-run';
const OVERSIZED_TURN = 27; // one turn alone exceeds the budget: its big event must be clipped

import { TOOL_WORDS, codePoints, fedText, textGenerator } from './text.js';
const utf8Bytes = (text) => Buffer.byteLength(text, 'utf8');

// --- the sidecar process ------------------------------------------------------------------

// The window policy is "max_fill" here: these rules hold that the window is as full as it can be.
const sidecarFlags = () => ['--token-counter', 'chars', '--transcript-token-budget', String(BUDGET),
  // The window rules over the host's own events, as max_fill chose them: tool-result clearing
  // (its own log entries and placeholders) is tested in the Python suite and in cache.test.js.
  '--window-policy', 'max_fill', '--no-clearing-enabled'];

// --- deterministic content ----------------------------------------------------------------

const { rng, randInt, pick, randomText, toolCallContent } = textGenerator(0x5eed2024, TOOL_WORDS);

// The 40 turns, decided up front. Turn i: [results deferred from turn i-1], user message,
// tool call `call-<i>`, [its result(s), unless deferred to turn i+1], assistant message.
function planTurns() {
  const turns = [];
  let deferred = null; // results of the previous turn's call, sent in this turn
  for (let i = 1; i <= TURNS; i++) {
    const events = [];
    if (deferred) events.push(...deferred);
    deferred = null;

    const large = rng() < 0.25;
    // iteration 0 means "the turn being assembled"; some events name the turn explicitly.
    const iterationField = () => (rng() < 0.3 ? i : 0);
    events.push({ event_id: `t${i}-user`, iteration: iterationField(), role: 'user',
      type: rng() < 0.5 ? '' : 'message', content: randomText(randInt(10, 160)) });
    const callId = `call-${i}`;
    events.push({ event_id: `t${i}-call`, iteration: iterationField(), role: 'assistant',
      type: 'tool_call', call_id: callId, content: toolCallContent(randInt(40, 120)) });

    const resultCount = rng() < 0.35 ? 2 : 1;
    const results = [];
    for (let k = 1; k <= resultCount; k++) {
      let length = large ? randInt(300, 900) : randInt(30, 250);
      if (i === OVERSIZED_TURN && k === 1) length = 2300;
      results.push({ event_id: `t${i}-result-${k}`, role: 'tool', type: 'tool_result', call_id: callId,
        content: randomText(length) });
    }
    const defer = i < TURNS && i !== OVERSIZED_TURN && rng() < 0.3;
    if (defer) {
      // Sent next turn, so its iteration is that turn's.
      deferred = results.map((r) => ({ ...r, iteration: rng() < 0.5 ? i + 1 : 0 }));
    } else {
      events.push(...results.map((r) => ({ ...r, iteration: iterationField() })));
    }
    events.push({ event_id: `t${i}-assistant`, iteration: iterationField(), role: 'assistant',
      type: 'message', content: randomText(randInt(10, 200)) });
    turns.push({ iteration: i, events, deferredCall: defer });
  }
  return turns;
}

// --- the window rules, checked against what we sent ---------------------------------------

// `sent` holds every event sent so far, in send order; sent[k] is the event with seq k.
// Returns facts about the window for the test's coverage assertions.
function checkWindow(resp, { iteration, budget, sent }) {
  assert.equal(resp.run_id, RUN_ID);
  assert.equal(resp.iteration, iteration);
  assert.equal(resp.token_counter, 'chars');
  assert.equal(resp.token_budget, budget);

  const prefix = sent.filter((e) => e.iteration <= iteration);
  const end = prefix.length;
  // Iterations never decrease, so the events with iteration <= N are a prefix of the log.
  assert.deepEqual(prefix, sent.slice(0, end), 'events with iteration <= N form a prefix');
  const { entries } = resp;
  assert.ok(entries.length > 0, 'the window is not empty');

  // A contiguous recent tail, ending at the last event with iteration <= N.
  const start = resp.omitted_events;
  assert.equal(entries[0].seq, start, 'omitted_events == first entry seq');
  entries.forEach((entry, k) => assert.equal(entry.seq, start + k, `entry ${k} seq is contiguous`));
  assert.equal(entries[entries.length - 1].seq, end - 1, 'the window ends at the last event of the prefix');
  assert.deepEqual(resp.event_ids, entries.map((e) => e.event_id), 'event_ids match entries');

  // Each entry is the event we sent with that seq, and its tokens are recounted here.
  let recount = 0;
  let clipped = 0;
  for (const entry of entries) {
    const event = sent[entry.seq];
    const where = `entry seq ${entry.seq} (${event.event_id}) of iteration ${iteration}`;
    assert.equal(entry.event_id, event.event_id, where);
    assert.equal(entry.iteration, event.iteration, where);
    assert.equal(entry.role, event.role, where);
    assert.equal(entry.type, event.type, where);
    assert.equal(entry.call_id, event.call_id, where);
    assert.equal(entry.tokens, codePoints(entry.text), `${where}: tokens == code points of text`);
    if (entry.clipped_from_tokens === 0) {
      assert.equal(entry.text, event.content, `${where}: text is the content`);
    } else {
      clipped += 1;
      assert.equal(entry.clipped_from_tokens, codePoints(event.content), `${where}: clipped_from_tokens`);
      assert.ok(codePoints(entry.text) < codePoints(event.content), `${where}: clipped text is shorter`);
      assert.match(entry.text, /elided/, `${where}: clipped text carries the elision marker`);
    }
    recount += codePoints(entry.text);
  }
  assert.equal(resp.token_count, recount, 'token_count == sum of recounted entry tokens');
  assert.equal(resp.token_count, entries.reduce((s, e) => s + e.tokens, 0), 'token_count == sum of entry tokens');
  assert.ok(resp.token_count <= resp.token_budget, `token_count ${resp.token_count} <= budget ${resp.token_budget}`);

  // Every event of the active turn is in the window.
  for (const event of prefix) {
    if (event.iteration === iteration) {
      assert.ok(event.seq >= start, `active-turn event ${event.event_id} is in the window of ${iteration}`);
    }
  }

  // A tool call and its results are both in or both out.
  const inWindow = (e) => e.seq >= start;
  const groups = new Map();
  for (const event of prefix) {
    if (event.call_id) groups.set(event.call_id, [...(groups.get(event.call_id) || []), event]);
  }
  for (const [callId, members] of groups) {
    const kept = members.filter(inWindow).length;
    assert.ok(kept === 0 || kept === members.length,
      `call_id ${callId}: ${kept} of ${members.length} events in the window of ${iteration}`);
  }

  // A cut at k keeps every call_id group whole when no group has members on both sides of k.
  const whole = (k) => [...groups.values()].every((members) =>
    members.every((e) => e.seq >= k) || members.every((e) => e.seq < k));
  const contentTokens = (from, to) => prefix.slice(from, to).reduce((s, e) => s + codePoints(e.content), 0);

  if (clipped > 0) {
    // Clipping is for a turn that cannot fit whole: the unclipped window would not fit.
    assert.ok(contentTokens(start, end) > budget, `clipping in iteration ${iteration} was needed`);
  } else {
    // Not our brief's rule, but what "recent tail under a budget" means: no longer tail that
    // keeps groups whole would have fit, so nothing was dropped needlessly.
    for (let k = start - 1; k >= 0; k--) {
      if (whole(k)) {
        assert.ok(contentTokens(k, end) > budget,
          `iteration ${iteration}: the whole tail from seq ${k} (${contentTokens(k, end)} tokens) fits ` +
          `${budget}, yet the window starts at ${start}`);
        break; // older tails only grow
      }
    }
  }

  // Where a cut that ignored call_id groups would have started (for the coverage check).
  let naiveStart = end;
  while (naiveStart > 0 && contentTokens(naiveStart - 1, end) <= budget) naiveStart -= 1;
  return { clipped, omitted: start, groupMovedCut: clipped === 0 && naiveStart < start };
}

// How untrusted content is fed (from the capability document), set before the tests run.
let block;

// --- the test -----------------------------------------------------------------------------

describe('context sidecar over gRPC (Node.js client)', () => {
  let tmpDir;
  let sidecar;
  let client;
  const sent = []; // every event sent to RUN_ID, in order, as stored (type and iteration filled in)
  const answers = new Map(); // iteration -> AssembleContext answer
  const turns = planTurns();
  let driven = false; // the tests after the turns read their answers: skip them if the turns failed
  const needsTurns = (t) => {
    if (!driven) t.skip('the turns did not all pass');
    return driven;
  };

  before(async () => {
    tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'cs-node-'));
    sidecar = startSidecar(tmpDir, sidecarFlags());
    const address = await sidecar.ready;
    assert.equal(address, sidecar.address);
    client = connect(address);
    block = JSON.parse((await client.getCapabilities({})).capabilities_json).contextWindow.untrustedBlock;
  });

  after(async () => {
    if (client) client.close();
    await killSidecar(sidecar); // only if a failure skipped the clean stop below
    if (tmpDir) fs.rmSync(tmpDir, { recursive: true, force: true });
  });

  it('advertises the configured budget and counter', async () => {
    const { capabilities_json } = await client.getCapabilities({});
    const budget = JSON.parse(capabilities_json).multiAgent.executionModel.contextBudget;
    assert.equal(budget.transcriptTokenBudget, BUDGET);
    assert.equal(budget.tokenCounter, 'chars');
  });

  it('opens the run', async () => {
    const opened = await client.openRun({ run_id: RUN_ID, token_counter: 'chars', transcript_token_budget: BUDGET });
    assert.equal(opened.created, true);
    assert.deepEqual(opened.settings, { token_counter: 'chars', transcript_token_budget: BUDGET,
      keep_last_turns: 3, transcript_window: 0, summarization_supported: false,
      summarization_strategy: 'sliding-window', keep_last_tokens: 0 });
    // Confirming with the same settings, or none, is not a conflict.
    assert.equal((await client.openRun({ run_id: RUN_ID, token_counter: 'chars' })).created, false);
    assert.equal((await client.openRun({ run_id: RUN_ID })).created, false);
  });

  it(`assembles ${TURNS} turns within the rules`, async (t) => {
    const coverage = { omitted: 0, clipped: 0, groupMovedCut: 0, deferredCalls: 0 };
    for (const turn of turns) {
      const resp = await client.assembleContext({ run_id: RUN_ID, iteration: turn.iteration,
        append_events: turn.events });

      // Our record of the log: seqs in send order, defaults as the API documents them.
      const firstSeq = sent.length;
      turn.events.forEach((event, k) => {
        sent.push({ event_id: event.event_id, seq: firstSeq + k, iteration: event.iteration || turn.iteration,
          role: event.role, type: event.type || 'message', content: fedText(event, block), call_id: event.call_id || '' });
      });
      assert.equal(resp.appended.length, turn.events.length, 'one appended result per event');
      resp.appended.forEach((result, k) => {
        const event = sent[firstSeq + k];
        assert.deepEqual(result, { event_id: event.event_id, seq: event.seq,
          tokens: codePoints(event.content), already_recorded: false });
      });

      const facts = checkWindow(resp, { iteration: turn.iteration, budget: BUDGET, sent });
      answers.set(turn.iteration, resp);
      if (facts.omitted > 0) coverage.omitted += 1;
      if (facts.clipped > 0) coverage.clipped += 1;
      if (facts.groupMovedCut) coverage.groupMovedCut += 1;
      if (turn.deferredCall) coverage.deferredCalls += 1;
    }

    t.diagnostic(`coverage: ${JSON.stringify(coverage)}`);
    // The run exercised what it is meant to: non-ASCII text, dropped turns, clipping, and
    // call/result pairs that straddle turns and the window's edge.
    const all = sent.map((e) => e.content).join('');
    assert.ok(codePoints(all) < all.length && all.length < utf8Bytes(all), 'code points < UTF-16 units < bytes');
    assert.ok(coverage.omitted >= TURNS / 2, `older turns were dropped (${coverage.omitted} turns)`);
    assert.ok(coverage.clipped >= 1, 'the oversized turn was clipped');
    assert.ok(coverage.deferredCalls >= 3, `tool results sent a turn later (${coverage.deferredCalls})`);
    assert.ok(coverage.groupMovedCut >= 1, `a call/result group moved the cut (${coverage.groupMovedCut})`);
    driven = true;
  });

  it('feeds the oversized turn clipped, and only that event', async (t) => {
    if (!needsTurns(t)) return;
    const resp = answers.get(OVERSIZED_TURN);
    const clipped = resp.entries.filter((e) => e.clipped_from_tokens > 0);
    assert.deepEqual(clipped.map((e) => e.event_id), [`t${OVERSIZED_TURN}-result-1`]);
    // The result's own count: its 2300 code points inside the untrusted-data block.
    const fed = sent.find((e) => e.event_id === `t${OVERSIZED_TURN}-result-1`).content;
    assert.ok(fed.length > 2300);
    assert.equal(clipped[0].clipped_from_tokens, codePoints(fed));
  });

  it('returns the recorded window from GetTranscriptWindow', async (t) => {
    if (!needsTurns(t)) return;
    for (const iteration of [1, 2, 9, 17, OVERSIZED_TURN, OVERSIZED_TURN + 1, 33, TURNS]) {
      const assembled = answers.get(iteration);
      const window = await client.getTranscriptWindow({ run_id: RUN_ID, iteration });
      assert.equal(window.run_id, RUN_ID);
      assert.equal(window.iteration, iteration);
      assert.equal(window.token_counter, 'chars');
      assert.equal(window.token_budget, assembled.token_budget);
      assert.equal(window.token_count, assembled.token_count);
      assert.deepEqual(window.event_ids, assembled.event_ids);
      assert.deepEqual(window.entries, assembled.entries.map((e) => ({
        event_id: e.event_id, rendered: e.text, tokens: e.tokens })));
      for (const entry of window.entries) assert.equal(entry.tokens, codePoints(entry.rendered));
    }
  });

  it('re-assembles an assembled iteration to the identical window', async (t) => {
    if (!needsTurns(t)) return;
    for (const iteration of [TURNS, 12, OVERSIZED_TURN, 1]) {
      const again = await client.assembleContext({ run_id: RUN_ID, iteration });
      assert.deepEqual(again, { ...answers.get(iteration), appended: [] }, `iteration ${iteration}`);
    }
  });

  it('pages through every stored event with ListRunEvents', async (t) => {
    if (!needsTurns(t)) return;
    const listed = [];
    let from = 0;
    for (;;) {
      const page = await client.listRunEvents({ run_id: RUN_ID, from_seq: from, limit: 7 });
      listed.push(...page.events);
      if (page.next_from_seq === undefined) {
        assert.ok(page.events.length <= 7);
        break;
      }
      assert.equal(page.events.length, 7);
      assert.equal(page.next_from_seq, from + 7);
      from = page.next_from_seq;
    }
    assert.equal(listed.length, sent.length);
    listed.forEach((stored, k) => {
      const { event_id, seq, iteration, role, type, content, call_id } = sent[k];
      assert.deepEqual(stored, { event_id, seq, iteration, role, type, content, call_id,
        tokens: codePoints(content), tool_name: '' });
    });
    // limit 0 means 100.
    const first = await client.listRunEvents({ run_id: RUN_ID });
    assert.equal(first.events.length, Math.min(100, sent.length));
  });

  it('counts tokens like we do, in chars and o200k_base', async (t) => {
    if (!needsTurns(t)) return;
    const clippedText = answers.get(OVERSIZED_TURN).entries.find((e) => e.clipped_from_tokens > 0).text;
    const texts = ['héllo 日本 😀', '👍🏽🇫🇷', 'e\u0301', clippedText, ...sent.slice(0, 6).map((e) => e.content)];
    const chars = await client.countTokens({ token_counter: 'chars', texts });
    assert.equal(chars.token_counter, 'chars');
    assert.deepEqual(chars.counts, texts.map(codePoints));
    assert.deepEqual(chars.counts.slice(0, 3), [10, 4, 2]); // not UTF-16 units (11, 8, 2)
    const o200k = await client.countTokens({ token_counter: 'o200k_base', texts });
    assert.equal(o200k.token_counter, 'o200k_base');
    assert.equal(o200k.counts.length, texts.length);
    for (const count of o200k.counts) assert.ok(count > 0, `o200k_base count ${count} > 0`);
  });

  it('holds a window to max_transcript_tokens, which only tightens the budget', async () => {
    const runId = 'node-tight-run';
    const events = [1, 2, 3, 4].map((k) => ({ event_id: `tight-${k}`, role: k % 2 ? 'user' : 'assistant',
      content: randomText(100) }));
    // 400 code points under 200: each event is clipped to a cap of 50, room for the elision marker.
    const tight = await client.assembleContext({ run_id: runId, iteration: 1, append_events: events,
      max_transcript_tokens: 200 });
    assert.equal(tight.token_budget, 200);
    assert.ok(tight.token_count <= 200);
    assert.equal(tight.token_count, tight.entries.reduce((s, e) => s + codePoints(e.text), 0));
    for (const entry of tight.entries) assert.match(entry.text, /chars elided/, `${entry.event_id} carries the marker`);
    const loose = await client.assembleContext({ run_id: runId, iteration: 1, max_transcript_tokens: 5000 });
    assert.equal(loose.token_budget, BUDGET);
    assert.equal(loose.token_count, 400);
    assert.equal(loose.omitted_events, 0);
  });

  it('answers bad requests with gRPC statuses naming the field', async (t) => {
    if (!needsTurns(t)) return;
    // The rich details travel in the standard trailer (google.rpc.Status with ErrorInfo).
    assertReason(assertStatus(await rejection(client.assembleContext({ run_id: RUN_ID, iteration: 0 })),
      status.INVALID_ARGUMENT, 'iteration'), 'validation_error');

    assertStatus(await rejection(client.getTranscriptWindow({ run_id: 'no-such-run', iteration: 1 })),
      status.NOT_FOUND, 'no-such-run');
    assertStatus(await rejection(client.getTranscriptWindow({ run_id: RUN_ID, iteration: TURNS + 1 })),
      status.NOT_FOUND, 'iteration');
    assertStatus(await rejection(client.getTranscriptWindow({ run_id: RUN_ID, iteration: 0 })),
      status.INVALID_ARGUMENT, 'iteration');

    // An event after the iteration being assembled, and a bad role: the whole call fails and
    // nothing of it is appended.
    const before = (await client.listRunEvents({ run_id: RUN_ID, from_seq: 0, limit: 1000 })).events.length;
    assertStatus(await rejection(client.assembleContext({ run_id: RUN_ID, iteration: TURNS + 1,
      append_events: [{ event_id: 'late-1', role: 'user', content: 'x' },
        { event_id: 'late-2', iteration: TURNS + 2, role: 'user', content: 'y' }] })),
    status.INVALID_ARGUMENT, 'append_events[1].iteration');
    const err = assertStatus(await rejection(client.assembleContext({ run_id: RUN_ID, iteration: TURNS + 1,
      append_events: [{ event_id: 'late-1', role: 'user', content: 'x' },
        { event_id: 'late-2', role: 'robot', content: 'y' }] })),
    status.INVALID_ARGUMENT, 'append_events[1].role');
    assert.ok(err.metadata.get('grpc-status-details-bin')[0].includes('append_events[1].role'),
      'BadRequest names the field');
    const afterCount = (await client.listRunEvents({ run_id: RUN_ID, from_seq: 0, limit: 1000 })).events.length;
    assert.equal(afterCount, before, 'a failed AssembleContext appends nothing');

    assertStatus(await rejection(client.openRun({ run_id: 'too-big', transcript_token_budget: BUDGET + 1 })),
      status.INVALID_ARGUMENT, 'transcript_token_budget');
    assertStatus(await rejection(client.openRun({ run_id: RUN_ID, token_counter: 'o200k_base' })),
      status.ALREADY_EXISTS, 'token_counter');
    assertStatus(await rejection(client.countTokens({ token_counter: 'nope', texts: ['x'] })),
      status.INVALID_ARGUMENT, 'token_counter');
  });

  it('stops cleanly on SIGTERM', async () => {
    client.close();
    client = null;
    await stopWithSigterm(sidecar);
  });
});
