// Integration test: memory compaction (RFC 0012) through the proto from Node.js: CompactMemory
// with the host's summary and with the built-in distiller, the background job, the
// memory.compacted events (ListMemoryEvents, and live through the WatchEvents stream), against a
// real sidecar with compaction on and the "chars" memory token counter.
//
// Every figure the sidecar reports is recounted here: with "chars" a text's tokens are its
// Unicode code points, [...text].length, and byteSize is its UTF-8 length.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { connect, STREAMING_METHODS, status } from '@context-sidecar/client';
import { startSidecar, killSidecar, stopWithSigterm } from './sidecar.js';
import { assertStatus, assertReason, rejection } from './assertions.js';
import { codePoints } from './text.js';

const MIN_ENTRIES = 12; // the job compacts a ref holding more live entries than this
const KEEP_RECENT = 4; // ... and never takes its newest 4
const MAX_OUTPUT_BYTES = 4096;
const TOKEN_BUDGET = 600;
const FLAGS = ['--memory-token-counter', 'chars', '--compaction-enabled', '--compaction-interval-seconds', '0.2',
  '--compaction-min-entries', String(MIN_ENTRIES), '--compaction-keep-recent', String(KEEP_RECENT),
  '--compaction-max-output-bytes', String(MAX_OUTPUT_BYTES), '--compaction-token-budget', String(TOKEN_BUDGET)];

const SECRET = { secret_id: 'vault-token', value: 'hvs-Q9f2-zebra-ümlaut-🔐' };

// Sources with several sentences each: the distiller takes the first sentence of a source.
const NOTES = [
  ['The deploy to staging runs on Friday. Nobody reviews it after six.', ['ops']],
  ['The user prefers short answers in French. Long lists annoy them 😅.', ['préférence']],
  ['The staging config lives in the infra repo! It is mirrored nightly.', ['ops']],
  ['Invoice 42 was sent to the client on Monday. They paid on Thursday.', []],
  ['The deploy checklist sits in the wiki (デプロイ). Update it after each deploy.', ['ops', 'wiki']],
  ['The user asked about the staging deploy twice? Worth a pinned note.', ['pinned']],
  ['Team meeting notes go to the shared drive. Minutes are optional.', []],
  ['Ticket 7 blocks the Friday deploy to staging. Owner: Ana.', ['ops']],
];

function firstSentence(text) {
  return text.trim().split(/(?<=[.!?])\s|\n/, 1)[0].split(/\s+/).join(' ');
}

/** Resolve with the next `count` notices of `stream`; reject after `ms` or on an error. */
function nextNotices(stream, count, ms = 10000) {
  return new Promise((resolve, reject) => {
    const got = [];
    const timer = setTimeout(() => finish(new Error(`${got.length} of ${count} events within ${ms} ms`)), ms);
    const onData = (notice) => {
      got.push(notice);
      if (got.length === count) finish(null);
    };
    const onError = (err) => finish(err);
    function finish(err) {
      clearTimeout(timer);
      stream.off('data', onData);
      stream.off('error', onError);
      if (err) reject(err); else resolve(got);
    }
    stream.on('data', onData);
    stream.on('error', onError);
  });
}

/** Open a watch and resolve once the sidecar has registered it (its response headers arrived). */
function openWatch(client, types) {
  const stream = client.watchEvents({ types });
  stream.pause(); // keep every notice until a reader attaches
  return new Promise((resolve, reject) => {
    stream.once('metadata', () => resolve(stream));
    stream.once('error', reject);
  });
}

async function putAll(client, ref, notes) {
  const puts = [];
  for (const [content, tags] of notes) {
    const resp = await client.putMemory({ memory_ref: ref, content, tags });
    puts.push({ id: resp.entry_id, content, tags });
  }
  return puts;
}

/** Every live entry of `ref`, newest first. */
async function liveEntries(client, ref) {
  return (await client.listMemory({ memory_ref: ref, limit: 1000, token_budget: 1000000 })).entries;
}

/** The recounts every memory.compacted event must satisfy, against the distilled entry itself. */
function checkEvent(event, response, output, where) {
  assert.equal(event.type, 'memory.compacted', where);
  assert.match(event.ts, /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/, `${where}: ts`);
  assert.equal(event.outputId, response.output_id, `${where}: outputId`);
  assert.equal(event.compactionId, response.compaction_id, `${where}: compactionId`);
  assert.equal(event.sourceCount, response.source_count, `${where}: sourceCount`);
  assert.equal(event.byteSize, Buffer.byteLength(output.content, 'utf8'), `${where}: byteSize == UTF-8 bytes`);
  assert.equal(event.distillation.tokensUsed, codePoints(output.content), `${where}: tokensUsed == code points`);
  assert.equal(output.tokens, codePoints(output.content), `${where}: entry tokens`);
  assert.ok(event.distillation.tokensUsed <= event.distillation.tokenBudget, `${where}: within the budget`);
  assert.ok(output.tags.includes(`compacted-from:${response.compaction_id}`), `${where}: provenance tag`);
}

describe('memory compaction over gRPC (Node.js client)', () => {
  let tmpDir;
  let sidecar;
  let client;
  let watch;

  before(async () => {
    tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'cs-node-cmp-'));
    sidecar = startSidecar(tmpDir, FLAGS);
    client = connect(await sidecar.ready);
    watch = await openWatch(client, ['memory.compacted']);
  });

  after(async () => {
    if (watch) watch.cancel();
    if (client) client.close();
    await killSidecar(sidecar); // only if a failure skipped the clean stop below
    if (tmpDir) fs.rmSync(tmpDir, { recursive: true, force: true });
  });

  it('wraps WatchEvents as a stream', () => {
    assert.deepEqual(STREAMING_METHODS, { WatchEvents: 'watchEvents' });
    assert.equal(typeof watch.cancel, 'function');
  });

  it('advertises memory.compaction as configured', async () => {
    const caps = JSON.parse((await client.getCapabilities({})).capabilities_json);
    assert.deepEqual(caps.memory.compaction, { supported: true, trigger: 'both', maxInputEntries: 1000,
      maxOutputBytes: MAX_OUTPUT_BYTES });
  });

  it('replaces the named sources with the host\'s summary, secrets redacted, watched live', async () => {
    const ref = 'agent:alpha/host-summary';
    assert.deepEqual(await client.registerSecrets({ secrets: [SECRET] }), { registered: 1 });
    const puts = await putAll(client, ref, NOTES.slice(0, 6));
    const sources = puts.slice(0, 4);
    const summary = `Deploys: Friday, staging; config in infra; token ${SECRET.value} — invoice 42 sent ✔.`;
    const redacted = summary.replaceAll(SECRET.value, `[REDACTED:${SECRET.secret_id}]`);

    const live = nextNotices(watch, 1);
    watch.resume();
    const response = await client.compactMemory({ memory_ref: ref, source_ids: sources.map((s) => s.id),
      summary_text: summary });
    const [notice] = await live;
    watch.pause();
    assert.equal(response.created, true);
    assert.equal(response.source_count, 4);
    assert.match(response.compaction_id, /^cmp_[0-9a-f]{16}$/);

    const output = await client.getMemory({ memory_ref: ref, entry_id: response.output_id });
    assert.equal(output.content, redacted, 'SR-1 carried forward: the summary is stored redacted');
    assert.deepEqual(output.tags.filter((t) => !t.startsWith('compacted-from:')).sort(),
      [...new Set(sources.flatMap((s) => s.tags))].sort(), 'the union of the sources\' tags');
    const event = JSON.parse(response.event.json);
    checkEvent(event, response, output, 'CompactMemory event');
    assert.deepEqual(event, { type: 'memory.compacted', ts: event.ts, memoryRef: ref, outputId: response.output_id,
      sourceIds: sources.map((s) => s.id), sourceCount: 4, trigger: 'client-requested', byteSize: event.byteSize,
      distillation: { tokenBudget: TOKEN_BUDGET, tokensUsed: event.distillation.tokensUsed, indexUpdated: true },
      compactionId: response.compaction_id });
    assert.ok(!JSON.stringify(event).includes(SECRET.value));

    // The watch delivered that same event, live; the kept log holds it too.
    assert.deepEqual({ ...notice, json: JSON.parse(notice.json) }, { ...response.event, json: event });
    const kept = await client.listMemoryEvents({ memory_ref: ref });
    assert.deepEqual(kept.events, [response.event]);

    // The sources are gone, the other entries stay; a search finds the distilled entry.
    for (const source of sources) {
      assertStatus(await rejection(client.getMemory({ memory_ref: ref, entry_id: source.id })), status.NOT_FOUND);
    }
    assert.deepEqual((await liveEntries(client, ref)).map((e) => e.id).sort(),
      [response.output_id, puts[4].id, puts[5].id].sort());
    const found = await client.listMemory({ memory_ref: ref, rank: 'relevance', query: 'infra config' });
    assert.deepEqual(found.entries.map((e) => e.id), [response.output_id]);

    // A retry (the host did not see the answer) does nothing again.
    const retry = await client.compactMemory({ memory_ref: ref, source_ids: sources.map((s) => s.id).reverse(),
      summary_text: summary });
    assert.deepEqual(retry, { ...response, created: false });
    assert.equal((await client.listMemoryEvents({ memory_ref: ref })).events.length, 1, 'no second event');
    assert.deepEqual(await client.forgetSecrets({}), { forgotten: 1 });
  });

  it('distils with the built-in extractive distiller, within the token budget', async () => {
    const ref = 'agent:alpha/distilled';
    const puts = await putAll(client, ref, NOTES);
    const budget = 200;
    const response = await client.compactMemory({ memory_ref: ref, source_ids: puts.map((p) => p.id),
      token_budget: budget });
    const output = await client.getMemory({ memory_ref: ref, entry_id: response.output_id });
    const event = JSON.parse(response.event.json);
    checkEvent(event, response, output, 'distilled');
    assert.equal(event.distillation.tokenBudget, budget);
    assert.ok(codePoints(output.content) <= budget, `${codePoints(output.content)} <= ${budget} tokens`);

    const [header, ...lines] = output.content.split('\n');
    assert.equal(header, `Distilled from ${NOTES.length} memory entries (extractive):`);
    const firsts = puts.map((p) => firstSentence(p.content));
    const positions = lines.map((line) => {
      assert.ok(line.startsWith('- '), line);
      const at = firsts.indexOf(line.slice(2));
      assert.ok(at >= 0, `"${line}" is the first sentence of a source`);
      return at;
    });
    assert.ok(lines.length >= 2 && lines.length < NOTES.length, `the budget chose some sentences (${lines.length})`);
    assert.deepEqual(positions, [...positions].sort((a, b) => a - b), 'in the sources\' order');
    // Rare words lose to the vocabulary the sources share: Ticket 7's "deploy ... staging" line
    // outranks the meeting notes, which share nothing.
    assert.ok(positions.includes(7) && !positions.includes(6), `chose ${positions}`);
    assert.deepEqual((await liveEntries(client, ref)).map((e) => e.id), [response.output_id]);
  });

  it('answers bad compactions with a status naming the field, and writes nothing', async () => {
    const ref = 'agent:alpha/errors';
    const puts = await putAll(client, ref, NOTES.slice(0, 3));
    const ids = puts.map((p) => p.id);
    // [request, status, the field the details name, the machine code]
    const cases = [
      [{ source_ids: [ids[0]] }, status.INVALID_ARGUMENT, 'source_ids', 'validation_error'],
      [{ source_ids: [ids[0], ids[0]] }, status.INVALID_ARGUMENT, 'source_ids', 'validation_error'],
      [{ source_ids: [ids[0], 'no-such-entry'] }, status.INVALID_ARGUMENT, 'source_ids[1]', 'validation_error'],
      [{ source_ids: ids, token_budget: 0 }, status.INVALID_ARGUMENT, 'token_budget', 'validation_error'],
      [{ source_ids: ids, summary_text: 'x'.repeat(50), token_budget: 49 }, status.FAILED_PRECONDITION, null,
        'token_budget_exceeded'],
      [{ source_ids: ids, token_budget: 5 }, status.FAILED_PRECONDITION, null, 'token_budget_exceeded'],
    ];
    for (const [request, code, field, reason] of cases) {
      const err = await rejection(client.compactMemory({ memory_ref: ref, ...request }));
      assertReason(assertStatus(err, code, field), reason);
    }
    assertStatus(await rejection(client.compactMemory({ memory_ref: '', source_ids: ids })), status.INVALID_ARGUMENT,
      'memory_ref');
    assert.deepEqual((await liveEntries(client, ref)).map((e) => e.id).sort(), [...ids].sort(), 'all still there');
    assert.deepEqual((await client.listMemoryEvents({ memory_ref: ref })).events, []);
  });

  it('the background job compacts a ref that outgrows min_entries, keeping the newest', async (t) => {
    const ref = 'agent:beta/log';
    const notes = Array.from({ length: MIN_ENTRIES + 6 }, (_, i) => [
      `Log line ${i}: the staging deploy step ${i % 5} finished. Details follow.`, [`batch-${i % 3}`]]);
    const seqBefore = Math.max(0, ...(await client.listMemoryEvents({})).events.map((e) => e.seq));
    const watched = [];
    const onData = (notice) => watched.push(JSON.parse(notice.json));
    watch.on('data', onData);
    watch.resume();
    const puts = [];
    let kept;
    try {
      // The job may run between two puts: whatever it took must be accounted for below.
      puts.push(...await putAll(client, ref, notes));
      const deadline = Date.now() + 15000;
      const waitFor = async (done, what) => {
        while (!(await done())) {
          assert.ok(Date.now() < deadline, `${what} within 15 s`);
          await new Promise((resolve) => setTimeout(resolve, 50));
        }
      };
      await waitFor(async () => (await liveEntries(client, ref)).length <= MIN_ENTRIES, 'the job compacted the ref');
      // The kept log is written in the compaction's transaction; the watch is told after the commit.
      kept = (await client.listMemoryEvents({ memory_ref: ref, since_seq: seqBefore })).events
        .map((n) => JSON.parse(n.json));
      await waitFor(async () => watched.filter((e) => e.memoryRef === ref).length >= kept.length,
        'the watch delivered every kept event');
    } finally {
      watch.off('data', onData);
      watch.pause();
    }
    const ours = watched.filter((e) => e.memoryRef === ref);
    t.diagnostic(`${ours.length} compaction(s) of ${puts.length} entries`);
    assert.ok(ours.length >= 1);
    assert.deepEqual(ours, kept, 'the watch delivered what the log kept, in order');

    // Live entries == what we put, plus every output, minus every source: nothing lost or doubled.
    const expected = new Set(puts.map((p) => p.id));
    for (const event of ours) {
      assert.equal(event.trigger, 'host-managed');
      assert.equal(event.sourceIds.length, event.sourceCount);
      for (const id of event.sourceIds) assert.ok(expected.delete(id), `source ${id} was live`);
      expected.add(event.outputId);
    }
    const live = await liveEntries(client, ref);
    assert.deepEqual(live.map((e) => e.id).sort(), [...expected].sort());
    const newest = puts.slice(-KEEP_RECENT).map((p) => p.id);
    for (const id of newest) assert.ok(expected.has(id), `the newest ${KEEP_RECENT} are never taken (${id})`);
    for (const event of ours) {
      const output = live.find((e) => e.id === event.outputId);
      if (output) checkEvent(event, { output_id: event.outputId, compaction_id: event.compactionId,
        source_count: event.sourceCount }, output, 'job event');
    }
  });

  it('stops cleanly on SIGTERM, ending the open watch', async () => {
    const ended = new Promise((resolve) => {
      watch.on('error', (err) => resolve(`${err.code} ${err.details}`));
      watch.on('end', () => resolve('end'));
    });
    watch.resume();
    await stopWithSigterm(sidecar);
    // The sidecar closes its watches before it stops: the stream ends with OK, not cut off.
    assert.equal(await ended, 'end', `the watch ended cleanly; stderr:\n${sidecar.stderr()}`);
    client.close();
    client = null;
    watch = null;
  });
});
