// Integration test of declared summarization (RecordSummary) over gRPC: a real sidecar with
// summarization on, driven turn by turn like a host that summarises whenever the sidecar says
// compaction is due, then replayed in a fork whose host summarises differently.
//
// As in transcript.test.js, every number is recounted here ("chars": Unicode code points,
// [...text].length), and every window is checked against our own record of the run's log: the
// events we sent and the summaries we recorded, never against the server's view of it.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { connect, METHODS, STREAMING_METHODS, status } from '@context-sidecar/client';
import { startSidecar, killSidecar, stopWithSigterm, REPO_ROOT } from './sidecar.js';
import { assertStatus, rejection } from './assertions.js';

const BUDGET = 2000;
const KEEP_LAST_TURNS = 2;
const COMPACTION_FRACTION = 0.75; // the sidecar's default ([context] compaction_fraction)
const TURNS = 30;
const RUN_ID = 'node-summaries-run';
const FORK_ID = 'node-summaries-replay';
const SUMMARY_TYPE = 'context.summary';
const SUMMARIZED_TYPE = 'context.summarized';
const PAYLOAD_FIELDS = ['iteration', 'replacedTurns', 'summaryRef', 'tokenCounter', 'tokensBefore', 'tokensAfter'];

import { TOOL_WORDS, codePoints, fedText, textGenerator } from './text.js';
const sum = (values) => values.reduce((s, v) => s + v, 0);

// The window policy is "max_fill" here: these rules hold that the window is as full as it can be.
const sidecarFlags = () => ['--token-counter', 'chars', '--transcript-token-budget', String(BUDGET),
  '--keep-last-turns', String(KEEP_LAST_TURNS), '--summarization', '--window-policy', 'max_fill'];

// --- deterministic content (the generator of transcript.test.js, smaller turns) -----------

const { rng, randInt, pick, randomText, toolCallContent } = textGenerator(0x50aa1e5, TOOL_WORDS);

// Turn i: [results deferred from turn i-1], user message, tool call `call-<i>`, [its result(s),
// unless deferred to turn i+1], assistant message. A turn is ~300-700 tokens (a tool result is
// fed inside the untrusted-data block, which adds its tags and preamble): several fit the budget,
// so compaction comes due every few turns, and no turn has to be clipped.
function planTurns() {
  const turns = [];
  let deferred = null;
  for (let i = 1; i <= TURNS; i++) {
    const events = [];
    if (deferred) events.push(...deferred);
    deferred = null;
    const iterationField = () => (rng() < 0.3 ? i : 0); // 0: the turn being assembled
    events.push({ event_id: `s${i}-user`, iteration: iterationField(), role: 'user',
      type: rng() < 0.5 ? '' : 'message', content: randomText(randInt(10, 30)) });
    const callId = `scall-${i}`;
    events.push({ event_id: `s${i}-call`, iteration: iterationField(), role: 'assistant',
      type: 'tool_call', call_id: callId, content: toolCallContent(randInt(40, 50)) });
    const results = [];
    for (let k = 1; k <= (rng() < 0.25 ? 2 : 1); k++) {
      results.push({ event_id: `s${i}-result-${k}`, role: 'tool', type: 'tool_result', call_id: callId,
        content: randomText(randInt(10, 40)) });
    }
    const defer = i < TURNS && rng() < 0.3;
    if (defer) {
      deferred = results.map((r) => ({ ...r, iteration: rng() < 0.5 ? i + 1 : 0 }));
    } else {
      events.push(...results.map((r) => ({ ...r, iteration: iterationField() })));
    }
    events.push({ event_id: `s${i}-assistant`, iteration: iterationField(), role: 'assistant',
      type: 'message', content: randomText(randInt(10, 30)) });
    turns.push({ iteration: i, events, deferredCall: defer });
  }
  return turns;
}

// The host's summary of what the sidecar proposed: a few words of each entry, clipped to a
// third of what it replaces (at most 120 code points). `label` differs between the source
// host and the replaying host, which "answers differently".
function makeSummaryText(label, replaced) {
  const tokensBefore = sum(replaced.map((e) => e.tokens));
  const snippets = replaced.map((e) => `${e.role}/${e.type}: ${[...e.text].slice(0, 12).join('')}`).join('; ');
  const full = `${label} of ${replaced.length} entries: ${snippets}`;
  const text = [...full].slice(0, Math.max(8, Math.min(80, Math.floor(tokensBefore / 4)))).join('');
  assert.ok(codePoints(text) < tokensBefore, 'the summary is shorter than what it replaces');
  return text;
}

// --- our record of a run ------------------------------------------------------------------

// The log as we know it: host events as sent (defaults filled in) and the context.summarized
// entries of the summaries we recorded, each at its seq; hostEvents is the host events alone.
function newRecord(runId) {
  return { runId, log: [], hostEvents: [], byId: new Map(), summaries: [], answers: new Map(),
    recorded: [], summaryWindows: 0, fedWhenRecorded: 0 };
}

function appendHostEvents(rec, turn) {
  const firstSeq = rec.log.length;
  return turn.events.map((event, k) => {
    const stored = { event_id: event.event_id, seq: firstSeq + k, iteration: event.iteration || turn.iteration,
      role: event.role, type: event.type || 'message', content: fedText(event, block), call_id: event.call_id || '',
      host: rec.hostEvents.length };
    rec.log.push(stored);
    rec.hostEvents.push(stored);
    rec.byId.set(stored.event_id, stored);
    return stored;
  });
}

const inForce = (rec, iteration) => rec.summaries.filter((s) => s.iteration <= iteration);
// The index (in hostEvents) of the first event no summary in force at `iteration` replaced.
const floorAt = (rec, iteration) => {
  const stack = inForce(rec, iteration);
  return stack.length ? stack[stack.length - 1].toHost : 0;
};
// What a replaced id weighs: an event's content, or a summary's text.
function replacedTokens(rec, id) {
  const summary = rec.summaries.find((s) => s.ref === id);
  return summary ? summary.tokens : codePoints(rec.byId.get(id).content);
}

// --- checks -------------------------------------------------------------------------------

async function listAll(client, runId) {
  const events = [];
  let from = 0;
  for (;;) {
    const page = await client.listRunEvents({ run_id: runId, from_seq: from, limit: 1000 });
    events.push(...page.events);
    if (page.next_from_seq === undefined) return events;
    from = page.next_from_seq;
  }
}

// An AssembleContext answer for `iteration`, against our record. Returns how many summary
// entries the window holds.
async function checkWindow(client, rec, resp, iteration) {
  const where = `${rec.runId} iteration ${iteration}`;
  assert.equal(resp.run_id, rec.runId);
  assert.equal(resp.iteration, iteration);
  assert.equal(resp.token_counter, 'chars');
  assert.equal(resp.token_budget, BUDGET);
  const { entries } = resp;
  assert.deepEqual(resp.event_ids, entries.map((e) => e.event_id), `${where}: event_ids match entries`);

  // Counts: each entry's tokens are its text's code points; the window adds them up, in budget.
  for (const entry of entries) {
    assert.equal(entry.tokens, codePoints(entry.text), `${where}: ${entry.event_id} tokens == code points`);
    assert.equal(entry.clipped_from_tokens, 0, `${where}: ${entry.event_id} is not clipped`);
  }
  assert.equal(resp.token_count, sum(entries.map((e) => codePoints(e.text))), `${where}: token_count recounted`);
  assert.equal(resp.token_count, sum(entries.map((e) => e.tokens)), `${where}: token_count == sum of tokens`);
  assert.ok(resp.token_count <= BUDGET, `${where}: token_count ${resp.token_count} <= ${BUDGET}`);

  // Summary entries first: the newest of the summaries in force, in stack order, each fed as
  // its artifact holds it.
  const k = entries.findIndex((e) => e.type !== SUMMARY_TYPE);
  assert.ok(k >= 0, `${where}: the window has verbatim events`);
  assert.ok(entries.slice(k).every((e) => e.type !== SUMMARY_TYPE), `${where}: summary entries come first`);
  const stack = inForce(rec, iteration);
  assert.ok(k <= stack.length, `${where}: ${k} summary entries, ${stack.length} summaries in force`);
  const shown = stack.slice(stack.length - k);
  for (const [j, summary] of shown.entries()) {
    const entry = entries[j];
    assert.deepEqual({ ...entry }, { event_id: summary.ref, seq: summary.seq, iteration: summary.iteration,
      role: 'system', type: SUMMARY_TYPE, call_id: '', text: summary.text, tokens: summary.tokens,
      clipped_from_tokens: 0, tool_name: '' }, `${where}: summary entry ${j}`);
    const artifact = await client.getArtifact({ run_id: rec.runId, artifact_id: entry.event_id });
    assert.equal(entry.text, artifact.content, `${where}: summary text == GetArtifact content`);
  }

  // Then a contiguous tail of the unsummarised host events, verbatim, ending with the last
  // event of the iteration; with summaries in the window, every unsummarised event is in.
  const floor = floorAt(rec, iteration);
  const prefix = rec.hostEvents.filter((e) => e.iteration <= iteration);
  assert.deepEqual(prefix, rec.hostEvents.slice(0, prefix.length), `${where}: iterations never decrease`);
  const verbatim = entries.slice(k);
  const first = rec.byId.get(verbatim[0].event_id);
  assert.ok(first, `${where}: ${verbatim[0].event_id} is an event we sent`);
  assert.ok(first.host >= floor, `${where}: no event a summary in force replaced is fed (${first.host} >= ${floor})`);
  if (k > 0) assert.equal(first.host, floor, `${where}: with summaries in, the window starts at the floor`);
  assert.deepEqual(verbatim.map((e) => e.event_id), prefix.slice(first.host).map((e) => e.event_id),
    `${where}: the verbatim entries are the recent tail of the log`);
  for (const entry of verbatim) {
    const event = rec.byId.get(entry.event_id);
    assert.deepEqual({ ...entry }, { event_id: event.event_id, seq: event.seq, iteration: event.iteration,
      role: event.role, type: event.type, call_id: event.call_id, text: event.content,
      tokens: codePoints(event.content), clipped_from_tokens: 0, tool_name: '' }, `${where}: ${entry.event_id} verbatim`);
  }
  // The host events before the window are either stood in for by a summary in it or left out.
  // The fed summaries are the newest k in force; they cover from the floor of the one before them.
  const coveredFrom = stack.length > k ? stack[stack.length - k - 1].toHost : 0;
  const summarised = k > 0 ? floor - coveredFrom : 0;
  assert.equal(resp.summarized_events, summarised, `${where}: summarized_events == events the fed summaries replaced`);
  assert.equal(resp.omitted_events, first.host - summarised, `${where}: omitted_events == host events left out`);
  for (const event of prefix.filter((e) => e.iteration === iteration)) {
    assert.ok(event.host >= first.host, `${where}: active-turn event ${event.event_id} is in the window`);
  }
  const groups = new Map();
  for (const event of prefix.slice(floor)) {
    if (event.call_id) groups.set(event.call_id, [...(groups.get(event.call_id) || []), event]);
  }
  for (const [callId, members] of groups) {
    const kept = members.filter((e) => e.host >= first.host).length;
    assert.ok(kept === 0 || kept === members.length, `${where}: call ${callId} is whole or out`);
  }

  // Compaction: due once the transcript exceeds the fraction of the budget (before any summary,
  // all of it; after one, only what was appended since that summary), and only when something
  // may be summarised; the candidates are the oldest unsummarised events, in order, outside the
  // keep_last_turns floor and the active turn, tool calls with their results.
  const { compaction } = resp;
  const top = stack.at(-1);
  const counted = top ? prefix.filter((e) => e.seq > top.seq) : prefix.slice(floor);
  const grown = sum(counted.map((e) => codePoints(e.content)));
  const summarisable = prefix.slice(floor).some((e) => e.iteration <= iteration - KEEP_LAST_TURNS);
  if (grown <= COMPACTION_FRACTION * BUDGET) {
    assert.equal(compaction.due, false, `${where}: not due with ${grown} tokens since the last summary`);
  } else if (summarisable) {
    assert.equal(compaction.due, true, `${where}: due with ${grown} tokens since the last summary`);
  }
  const candidates = compaction.candidate_event_ids;
  if (!compaction.due) assert.deepEqual(candidates, [], `${where}: no candidates when not due`);
  assert.deepEqual(candidates, prefix.slice(floor, floor + candidates.length).map((e) => e.event_id),
    `${where}: the candidates are the oldest unsummarised events, in order`);
  for (const id of candidates) {
    assert.ok(rec.byId.get(id).iteration <= iteration - KEEP_LAST_TURNS, `${where}: candidate ${id} is summarisable`);
    const callId = rec.byId.get(id).call_id;
    if (callId) {
      assert.ok(prefix.filter((e) => e.call_id === callId).every((e) => candidates.includes(e.event_id)),
        `${where}: candidate ${id} comes with its whole call ${callId}`);
    }
  }
  assert.equal(compaction.tokens_before, sum(candidates.map((id) => replacedTokens(rec, id))),
    `${where}: compaction.tokens_before recounted`);
  return k;
}

// A RecordSummary answer. `text` is what the summary must hold (the host's text, or in a
// replay the source's); `sentText` is what this host sent.
async function checkRecorded(client, rec, resp, { iteration, replaced, text, sentText, created = true }) {
  const where = `${rec.runId} summary for iteration ${iteration}`;
  assert.ok(resp.summary_ref, `${where}: has a summary_ref`);
  assert.equal(resp.created, created, `${where}: created`);
  assert.equal(resp.tokens_before, sum(replaced.map((id) => replacedTokens(rec, id))),
    `${where}: tokens_before == the replaced entries' code points`);
  assert.equal(resp.tokens_after, codePoints(text), `${where}: tokens_after == the text's code points`);
  const { event } = resp;
  assert.equal(event.type, SUMMARIZED_TYPE, `${where}: event type`);
  assert.equal(event.iteration, iteration, `${where}: event iteration`);
  assert.equal(event.call_id, '', `${where}: event call_id`);
  const payload = JSON.parse(event.content);
  assert.deepEqual(Object.keys(payload).sort(), [...PAYLOAD_FIELDS].sort(), `${where}: exactly RFC 0111's fields`);
  assert.deepEqual(payload, { iteration, replacedTurns: replaced, summaryRef: resp.summary_ref,
    tokenCounter: 'chars', tokensBefore: resp.tokens_before, tokensAfter: resp.tokens_after }, `${where}: payload`);
  assert.ok(!event.content.includes(text) && !event.content.includes(sentText), `${where}: the text is not inlined`);
  const artifact = await client.getArtifact({ run_id: rec.runId, artifact_id: resp.summary_ref });
  assert.deepEqual(artifact, { artifact_id: resp.summary_ref, content: text, tokens: codePoints(text), iteration },
    `${where}: the artifact`);
}

// GetTranscriptWindow for `iteration`: what was assembled, and summarized_ranges matching the
// context.summarized entries of the log.
function checkTranscriptWindow(rec, window, logEntries, iteration) {
  const where = `${rec.runId} GetTranscriptWindow ${iteration}`;
  const assembled = rec.answers.get(iteration);
  assert.deepEqual({ ...window, summarized_ranges: undefined }, { run_id: rec.runId, iteration,
    token_counter: 'chars', token_budget: assembled.token_budget, token_count: assembled.token_count,
    event_ids: assembled.event_ids, summarized_ranges: undefined,
    entries: assembled.entries.map((e) => ({ event_id: e.event_id, rendered: e.text, tokens: e.tokens })) }, where);
  const summaryIds = assembled.entries.filter((e) => e.type === SUMMARY_TYPE).map((e) => e.event_id);
  assert.deepEqual(window.summarized_ranges.map((r) => r.summary_ref), summaryIds, `${where}: one range per summary entry`);
  const announced = new Map(logEntries.filter((e) => e.type === SUMMARIZED_TYPE)
    .map((e) => [JSON.parse(e.content).summaryRef, JSON.parse(e.content)]));
  for (const range of window.summarized_ranges) {
    const payload = announced.get(range.summary_ref);
    assert.ok(payload, `${where}: ${range.summary_ref} is announced by a context.summarized entry`);
    assert.deepEqual(range.replaced_turns, payload.replacedTurns, `${where}: ${range.summary_ref} replacedTurns`);
    for (const id of range.replaced_turns) {
      const event = rec.byId.get(id);
      if (!event) continue; // a replaced summary
      assert.ok(event.iteration <= iteration - KEEP_LAST_TURNS,
        `${where}: replaced ${id} (iteration ${event.iteration}) is older than the last ${KEEP_LAST_TURNS} turns`);
    }
  }
  return window.summarized_ranges.length;
}

// --- driving a run ------------------------------------------------------------------------

// Assemble every turn; whenever compaction is due with candidates, summarise them (the text
// from `label`) from the next turn on. `expectedText(ref, sentText)` is what the stored summary
// must hold; `onRecorded` sees each RecordSummary answer.
async function drive(client, rec, turns, { label, expectedText, onRecorded = async () => {} }) {
  for (const turn of turns) {
    const resp = await client.assembleContext({ run_id: rec.runId, iteration: turn.iteration,
      append_events: turn.events });
    const stored = appendHostEvents(rec, turn);
    assert.deepEqual(resp.appended, stored.map((e) => ({ event_id: e.event_id, seq: e.seq,
      tokens: codePoints(e.content), already_recorded: false })), `${rec.runId} turn ${turn.iteration}: appended`);
    rec.answers.set(turn.iteration, resp);
    const fed = await checkWindow(client, rec, resp, turn.iteration);
    if (fed > 0) rec.summaryWindows += 1;
    // A summary recorded when compaction was due is fed in the very next window (the rules ask
    // for one only then: docs/transcript.md, "Summaries and replays"), and the cache report says
    // the prefix breaks where it entered. The fed summaries are the newest in force (checkWindow).
    if (rec.summaries.at(-1)?.iteration === turn.iteration) {
      const where = `${rec.runId} turn ${turn.iteration}`;
      assert.ok(fed >= 1, `${where}: the summary recorded for this turn is fed`);
      assert.equal(resp.cache.break_reason, 'summary_recorded', `${where}: the cache report names it`);
      rec.fedWhenRecorded += 1;
    }

    const { due, candidate_event_ids: candidates } = resp.compaction;
    if (!due || candidates.length === 0) continue;
    const iteration = turn.iteration + 1;
    const replaced = candidates.map((id) => {
      const event = rec.byId.get(id);
      return { role: event.role, type: event.type, text: event.content, tokens: codePoints(event.content) };
    });
    const sentText = makeSummaryText(label, replaced);
    const request = { run_id: rec.runId, iteration, replaced_event_ids: candidates, summary_text: sentText,
      strategy: 'sliding-window' };
    const recorded = await client.recordSummary(request);
    const text = expectedText(recorded.summary_ref, sentText);
    assert.equal(recorded.tokens_before, resp.compaction.tokens_before, 'tokens_before == compaction.tokens_before');
    assert.equal(recorded.event.seq, rec.log.length, 'the context.summarized entry takes the next seq');
    await checkRecorded(client, rec, recorded, { iteration, replaced: candidates, text, sentText });

    const summary = { ref: recorded.summary_ref, seq: recorded.event.seq, iteration, replaced: candidates,
      text, tokens: codePoints(text), toHost: rec.byId.get(candidates[candidates.length - 1]).host + 1 };
    rec.log.push({ event_id: recorded.event.event_id, seq: recorded.event.seq, type: SUMMARIZED_TYPE });
    rec.summaries.push(summary);
    rec.recorded.push({ request, response: recorded });
    await onRecorded(request, recorded);
  }
}

// How untrusted content is fed (from the capability document), set before the tests run.
let block;

// --- the test -----------------------------------------------------------------------------

describe('declared summarization over gRPC (Node.js client)', () => {
  let tmpDir;
  let sidecar;
  let client;
  const turns = planTurns();
  const source = newRecord(RUN_ID);
  const fork = newRecord(FORK_ID);
  const done = new Set();
  const needs = (t, ...steps) => {
    const missing = steps.filter((s) => !done.has(s));
    if (missing.length) t.skip(`needs: ${missing.join(', ')}`);
    return missing.length === 0;
  };

  before(async () => {
    tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'cs-node-summaries-'));
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

  it('wraps every RPC of the service', () => {
    // The service as the proto declares it (the package's code is generated from it).
    const proto = fs.readFileSync(path.join(REPO_ROOT, 'proto', 'contextsidecar', 'v1', 'sidecar.proto'), 'utf8');
    const service = Object.fromEntries([...proto.matchAll(/^\s*rpc (\w+)\(\w+\) returns \((stream )?\w+\);/gm)]
      .map(([, rpc, stream]) => [rpc, { responseStream: stream !== undefined }]));
    assert.ok(Object.keys(service).length >= 28, 'the proto has its RPCs');
    assert.deepEqual(Object.keys(service).sort(), [...Object.keys(METHODS), ...Object.keys(STREAMING_METHODS)].sort());
    // A unary wrapper resolves one response: it must not stand for a streaming RPC, nor the reverse.
    for (const rpc of Object.keys(METHODS)) assert.equal(service[rpc].responseStream, false, rpc);
    for (const rpc of Object.keys(STREAMING_METHODS)) assert.equal(service[rpc].responseStream, true, rpc);
    for (const name of [...Object.values(METHODS), ...Object.values(STREAMING_METHODS)]) {
      assert.equal(typeof client[name], 'function', name);
    }
  });

  it('opens a run that accepts summaries', async () => {
    const opened = await client.openRun({ run_id: RUN_ID, token_counter: 'chars', summarization_supported: true });
    assert.equal(opened.created, true);
    assert.deepEqual(opened.settings, { token_counter: 'chars', transcript_token_budget: BUDGET,
      keep_last_turns: KEEP_LAST_TURNS, transcript_window: 0, summarization_supported: true,
      summarization_strategy: 'sliding-window', keep_last_tokens: 0 });
    done.add('open');
  });

  it(`summarises while assembling ${TURNS} turns, within the rules`, async (t) => {
    if (!needs(t, 'open')) return;
    await drive(client, source, turns, { label: 'Summary', expectedText: (ref, sentText) => sentText });

    const all = source.hostEvents.map((e) => e.content).join('');
    assert.ok(codePoints(all) < all.length, 'the texts are not all BMP: code points < UTF-16 units');
    const deferred = turns.filter((turn) => turn.deferredCall).length;
    t.diagnostic(`summaries: ${source.summaries.length}, windows with a summary: ${source.summaryWindows}, ` +
      `deferred results: ${deferred}, log entries: ${source.log.length}`);
    assert.ok(source.summaries.length >= 2, `at least 2 summaries were recorded (${source.summaries.length})`);
    const assembled = source.summaries.filter((s) => s.iteration <= TURNS).length;
    assert.equal(source.fedWhenRecorded, assembled, 'every summary was fed at the turn it was recorded for');
    assert.ok(deferred >= 3, `tool results sent a turn later (${deferred})`);
    done.add('drive');
  });

  it('returns each window with summarized_ranges matching the log', async (t) => {
    if (!needs(t, 'drive')) return;
    const logEntries = await listAll(client, RUN_ID);
    // The log: our host events, and a context.summarized entry where each summary was recorded.
    assert.equal(logEntries.length, source.log.length);
    logEntries.forEach((stored, seq) => {
      const known = source.log[seq];
      assert.equal(stored.event_id, known.event_id, `seq ${seq}`);
      if (known.type === SUMMARIZED_TYPE) {
        const { response } = source.recorded.find((r) => r.response.event.seq === seq);
        assert.deepEqual(stored, response.event, `seq ${seq}: the entry RecordSummary returned`);
      } else {
        const { event_id, iteration, role, type, content, call_id } = known;
        assert.deepEqual(stored, { event_id, seq, iteration, role, type, content, call_id,
          tokens: codePoints(content), tool_name: '' }, `seq ${seq}`);
      }
    });
    let ranges = 0;
    for (let iteration = 1; iteration <= TURNS; iteration++) {
      const window = await client.getTranscriptWindow({ run_id: RUN_ID, iteration });
      ranges += checkTranscriptWindow(source, window, logEntries, iteration);
    }
    assert.ok(ranges >= 1, 'some window had a summarized range');
  });

  it('answers a retried RecordSummary with the recorded summary, another text with ALREADY_EXISTS', async (t) => {
    if (!needs(t, 'drive')) return;
    const logLength = (await listAll(client, RUN_ID)).length;
    for (const { request, response } of [source.recorded[0], source.recorded[source.recorded.length - 1]]) {
      const again = await client.recordSummary(request);
      assert.deepEqual(again, { ...response, created: false }, `retry of ${response.summary_ref}`);
      assertStatus(await rejection(client.recordSummary({ ...request, summary_text: `${request.summary_text} (v2)` })),
        status.ALREADY_EXISTS);
    }
    assert.equal((await listAll(client, RUN_ID)).length, logLength, 'retries and conflicts write nothing');
  });

  it('rejects a range that is not the oldest unsummarised events, or reaches the kept turns', async (t) => {
    if (!needs(t, 'drive')) return;
    const logLength = (await listAll(client, RUN_ID)).length;
    const iteration = TURNS + 1; // not assembled yet
    const unsummarised = source.hostEvents.slice(floorAt(source, iteration)).map((e) => e.event_id);
    assert.ok(unsummarised.length >= 3);
    const attempt = (ids) => rejection(client.recordSummary({ run_id: RUN_ID, iteration,
      replaced_event_ids: ids, summary_text: 'Summary of a bad range' }));
    // Skipping the oldest unsummarised event; a gap; everything up to the active turn.
    assertStatus(await attempt(unsummarised.slice(1, 2)), status.INVALID_ARGUMENT, 'replaced_event_ids');
    assertStatus(await attempt([unsummarised[0], unsummarised[2]]), status.INVALID_ARGUMENT, 'replaced_event_ids');
    assertStatus(await attempt(unsummarised), status.INVALID_ARGUMENT, 'replaced_event_ids');
    // Events summaries already replaced (not a recorded range: the exact range of a recorded
    // summary would be a retry, ALREADY_EXISTS with another text).
    assertStatus(await attempt([...source.summaries[0].replaced, ...source.summaries[1].replaced]),
      status.INVALID_ARGUMENT, 'replaced_event_ids');
    assert.equal((await listAll(client, RUN_ID)).length, logLength, 'rejected summaries write nothing');
  });

  it('replays the run in a fork to identical windows, with the original summaries', async (t) => {
    if (!needs(t, 'drive')) return;
    const forked = await client.forkRun({ source_run_id: RUN_ID, from_seq: 0, mode: 'replay', new_run_id: FORK_ID });
    assert.deepEqual(forked, { settings: (await client.openRun({ run_id: RUN_ID })).settings, next_seq: 0,
      pending_summaries: source.summaries.length, created: true });

    const originals = new Map(source.summaries.map((s) => [s.ref, s.text]));
    let k = 0;
    await drive(client, fork, turns, {
      label: 'Replayed summary', // the model answers differently this time
      expectedText: (ref, sentText) => {
        assert.ok(originals.has(ref), `the fork records the source's summary, not a new one (${ref})`);
        assert.notEqual(sentText, originals.get(ref), 'the replaying host sent another text');
        return originals.get(ref);
      },
      onRecorded: async (request, response) => {
        const original = source.recorded[k++];
        assert.ok(original, 'the source recorded as many summaries');
        assert.deepEqual(request.replaced_event_ids, original.request.replaced_event_ids, 'the same range');
        assert.deepEqual(response, original.response, 'the source\'s summary, recorded again');
      },
    });
    assert.equal(k, source.recorded.length, 'the fork recorded every summary of the source');

    for (let iteration = 1; iteration <= TURNS; iteration++) {
      const [a, b] = await Promise.all([client.getTranscriptWindow({ run_id: RUN_ID, iteration }),
        client.getTranscriptWindow({ run_id: FORK_ID, iteration })]);
      assert.deepEqual({ ...b, run_id: RUN_ID }, a, `GetTranscriptWindow ${iteration}: the fork's == the source's`);
      // Neither run has a task, so each one's task_id (its prompt cache key) is its own id.
      assert.equal(fork.answers.get(iteration).task_id, FORK_ID);
      assert.deepEqual({ ...fork.answers.get(iteration), run_id: RUN_ID, task_id: RUN_ID }, source.answers.get(iteration),
        `AssembleContext ${iteration}: the fork's == the source's`);
    }
    for (const [ref, text] of originals) {
      const artifact = await client.getArtifact({ run_id: FORK_ID, artifact_id: ref });
      assert.equal(artifact.content, text, `the fork's ${ref} holds the original text`);
    }
    const forkLog = await listAll(client, FORK_ID);
    assert.deepEqual(forkLog, await listAll(client, RUN_ID), 'the fork\'s log is the source\'s');
    done.add('fork');
  });

  it('deletes an artifact, then the fork; the source keeps its own', async (t) => {
    if (!needs(t, 'fork')) return;
    const iteration = [...fork.answers.keys()].find((i) => fork.answers.get(i).entries[0].type === SUMMARY_TYPE);
    const ref = fork.answers.get(iteration).entries[0].event_id;
    assert.deepEqual(await client.deleteArtifact({ run_id: FORK_ID, artifact_id: ref }), {});
    assertStatus(await rejection(client.getArtifact({ run_id: FORK_ID, artifact_id: ref })), status.NOT_FOUND);
    assertStatus(await rejection(client.deleteArtifact({ run_id: FORK_ID, artifact_id: ref })), status.NOT_FOUND);
    assertStatus(await rejection(client.getTranscriptWindow({ run_id: FORK_ID, iteration })),
      status.FAILED_PRECONDITION);
    assert.equal((await client.getArtifact({ run_id: RUN_ID, artifact_id: ref })).content,
      source.summaries.find((s) => s.ref === ref).text, 'the source\'s artifact is its own');
    await client.getTranscriptWindow({ run_id: RUN_ID, iteration });

    assert.deepEqual(await client.deleteRun({ run_id: FORK_ID }), {});
    assertStatus(await rejection(client.getTranscriptWindow({ run_id: FORK_ID, iteration: 1 })), status.NOT_FOUND);
    assertStatus(await rejection(client.listRunEvents({ run_id: FORK_ID })), status.NOT_FOUND);
    assertStatus(await rejection(client.deleteRun({ run_id: FORK_ID })), status.NOT_FOUND);
    assert.equal((await listAll(client, RUN_ID)).length, source.log.length, 'the source is untouched');
  });

  it('stops cleanly on SIGTERM', async () => {
    client.close();
    client = null;
    await stopWithSigterm(sidecar);
  });
});
