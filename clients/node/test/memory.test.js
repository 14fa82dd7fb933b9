// Integration test: memory (PutMemory/GetMemory/DeleteMemory/ListMemory), secrets
// (RegisterSecrets/ForgetSecrets) and tenancy, against a real sidecar configured with two
// tenants and the "chars" memory token counter.
//
// Every number the sidecar reports is recounted here: with "chars" a text's tokens are its
// Unicode code points, [...text].length. The token-bounded reads are checked against the RFC 0113
// rule computed here from our own record of what we put, never from the server's view.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { connect, METHODS, status } from '@context-sidecar/client';
import { startSidecar, killSidecar, stopWithSigterm } from './sidecar.js';
import { assertStatus, rejection } from './assertions.js';

import { codePoints, textGenerator } from './text.js';
const sha256Hex = (text) => crypto.createHash('sha256').update(text, 'utf8').digest('hex');

// --- tenants --------------------------------------------------------------------------------

// Random per test run; only their sha256 goes into the config file.
const TOKENS = {
  acme: `acme-${crypto.randomBytes(18).toString('base64url')}`,
  globex: `globex-${crypto.randomBytes(18).toString('base64url')}`,
};

function writeConfig(file) {
  const tenants = Object.entries(TOKENS).map(([id, token]) =>
    `[[auth.tenants]]\nid = "${id}"\ntoken_sha256 = "${sha256Hex(token)}"\n`);
  fs.writeFileSync(file, tenants.join('\n'));
}

// --- deterministic content ------------------------------------------------------------------

const ASCII_WORDS = ['the', 'user', 'prefers', 'short', 'answers', 'deploy', 'staging', 'on', 'friday',
  'config', 'lives', 'in', 'repo', 'team', 'meeting', 'notes', 'invoice', 'sent', 'yesterday', 'ticket'];
const { rng, randInt, pick, randomText } = textGenerator(0x6d656d30, ASCII_WORDS);

const REF = 'agent:alpha/notes';
const ENTRY_COUNT = 30;
const TOPIC_INDEX = 1; // put early, then buried under newer, unrelated entries
const TOPIC_QUERY = 'chlorophyll photosynthesis';
const TOPIC_TEXT = 'Botany note: photosynthesis in the chloroplast; chlorophyll absorbs red and blue light, ' +
  'the Calvin cycle fixes CO₂ 🌿 (光合成).';
const TAGS = ['ops', 'pinned', 'préférence'];
const NEWEST_LENGTH = 380; // the newest entry is long, so small budgets must skip it and go on

// The puts, decided up front, oldest first.
function planEntries() {
  const plan = [];
  for (let i = 0; i < ENTRY_COUNT; i++) {
    let content;
    if (i === TOPIC_INDEX) content = TOPIC_TEXT;
    else if (i === ENTRY_COUNT - 1) content = randomText(NEWEST_LENGTH);
    else content = randomText(rng() < 0.35 ? randInt(10, 45) : randInt(46, 400));
    const tags = rng() < 0.45 ? [...new Set([pick(TAGS), ...(rng() < 0.3 ? [pick(TAGS)] : [])])] : [];
    const put = { memory_ref: REF, content, tags };
    if (i % 5 === 3) put.entry_id = `note-${i}`;
    if (i % 7 === 2) put.ttl_seconds = 3600 * (1 + (i % 3));
    plan.push(put);
  }
  return plan;
}

// --- the RFC 0113 rule, from our own record -------------------------------------------------

// `records` oldest first, each { id, content, tags, tokens }. Walk newest-first; with a budget,
// an entry over the budget on its own is skipped (and counted), the first entry that does not
// fit in what remains is counted and stops the walk; nothing is truncated; the walk also stops
// once `limit` entries are taken (whichever bound yields fewer).
function expectedRecency(records, { token_budget: budget, limit = 0, tag = '' }) {
  const taken = [];
  let used = 0;
  let leftOut = 0;
  let skippedThenTook = false;
  for (const record of [...records].reverse()) {
    if (tag && !record.tags.includes(tag)) continue;
    if (budget !== undefined) {
      if (record.tokens > budget) {
        leftOut += 1;
        continue;
      }
      if (used + record.tokens > budget) {
        leftOut += 1;
        break;
      }
    }
    if (leftOut > 0) skippedThenTook = true;
    taken.push(record);
    used += record.tokens;
    if (limit && taken.length === limit) break;
  }
  return { ids: taken.map((r) => r.id), used, leftOut, skippedThenTook };
}

const millis = (ts) => ts.seconds * 1000 + ts.nanos / 1e6;

function checkTimestamp(ts, where) {
  assert.ok(ts && typeof ts === 'object', `${where}: a {seconds, nanos} object, got ${ts}`);
  assert.ok(Number.isInteger(ts.seconds), `${where}: seconds ${ts.seconds} is an integer Number`);
  assert.ok(Number.isInteger(ts.nanos) && ts.nanos >= 0 && ts.nanos < 1e9, `${where}: nanos ${ts.nanos}`);
}

// An entry as listed or got, against our record of it.
function checkEntry(entry, record, where) {
  assert.equal(entry.id, record.id, where);
  assert.equal(entry.content, record.content, `${where}: content as put`);
  assert.deepEqual([...entry.tags].sort(), [...record.tags].sort(), `${where}: tags`);
  assert.equal(entry.tokens, codePoints(entry.content), `${where}: tokens == code points of content`);
  checkTimestamp(entry.created_at, `${where} created_at`);
  assert.ok(millis(entry.created_at) >= record.putAfterMs - 1000 && millis(entry.created_at) <= record.putBeforeMs + 1000,
    `${where}: created_at ${millis(entry.created_at)} is when we put it`);
  if (record.ttl) {
    checkTimestamp(entry.expires_at, `${where} expires_at`);
    assert.deepEqual(entry.expires_at, { seconds: entry.created_at.seconds + record.ttl, nanos: entry.created_at.nanos },
      `${where}: expires_at == created_at + ttl_seconds`);
  } else {
    assert.equal(entry.expires_at, undefined, `${where}: no expires_at without a ttl`);
  }
}

// --- the test -------------------------------------------------------------------------------

describe('memory, secrets and tenants over gRPC (Node.js client)', () => {
  let tmpDir;
  let sidecar;
  let address;
  let acme;
  let globex;
  const records = []; // what acme put in REF, oldest first
  let stored = false; // the later tests read `records`: skip them if the puts failed
  const needsEntries = (t) => {
    if (!stored) t.skip('the puts did not all pass');
    return stored;
  };

  before(async () => {
    tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'cs-node-mem-'));
    const configFile = path.join(tmpDir, 'sidecar.toml');
    writeConfig(configFile);
    assert.ok(!fs.readFileSync(configFile, 'utf8').includes(TOKENS.acme), 'no token in the config file');
    sidecar = startSidecar(tmpDir, ['--config', configFile, '--memory-token-counter', 'chars']);
    address = await sidecar.ready;
    acme = connect(address, { token: TOKENS.acme });
    globex = connect(address, { token: TOKENS.globex });
  });

  after(async () => {
    for (const client of [acme, globex]) if (client) client.close();
    await killSidecar(sidecar); // only if a failure skipped the clean stop below
    if (tmpDir) fs.rmSync(tmpDir, { recursive: true, force: true });
  });

  it('wraps the memory and secret RPCs', () => {
    for (const [rpc, name] of [['PutMemory', 'putMemory'], ['GetMemory', 'getMemory'],
      ['DeleteMemory', 'deleteMemory'], ['ListMemory', 'listMemory'], ['RegisterSecrets', 'registerSecrets'],
      ['ForgetSecrets', 'forgetSecrets']]) {
      assert.equal(METHODS[rpc], name);
      assert.equal(typeof acme[name], 'function', name);
    }
  });

  it('advertises the chars memory token counter', async () => {
    const caps = JSON.parse((await acme.getCapabilities({})).capabilities_json);
    assert.equal(caps.memory.injectionBudget.tokenCounter, 'chars');
  });

  it(`puts ${ENTRY_COUNT} entries and gets each back as put`, async () => {
    const plan = planEntries();
    const all = plan.map((p) => p.content).join('');
    assert.ok(codePoints(all) < all.length && all.length < Buffer.byteLength(all), 'code points < UTF-16 units < bytes');
    for (const put of plan) {
      const putAfterMs = Date.now();
      const resp = await acme.putMemory(put);
      const putBeforeMs = Date.now();
      assert.deepEqual(resp, { entry_id: put.entry_id || resp.entry_id, tokens: codePoints(put.content),
        redacted_secret_ids: [], replaced: false });
      assert.ok(resp.entry_id.length > 0, 'the sidecar makes an id');
      records.push({ id: resp.entry_id, content: put.content, tags: put.tags, ttl: put.ttl_seconds || 0,
        tokens: codePoints(put.content), putAfterMs, putBeforeMs });
    }
    assert.equal(new Set(records.map((r) => r.id)).size, ENTRY_COUNT, 'distinct ids');
    for (const record of records) {
      checkEntry(await acme.getMemory({ memory_ref: REF, entry_id: record.id }), record, `GetMemory ${record.id}`);
    }
    stored = true;
  });

  it('lists newest first within token budgets, by the RFC 0113 rule', async (t) => {
    if (!needsEntries(t)) return;
    const newestTwo = records[ENTRY_COUNT - 1].tokens + records[ENTRY_COUNT - 2].tokens;
    const cases = [
      {}, { rank: 'recency' },
      { token_budget: 1 }, { token_budget: 50 }, { token_budget: 300 }, { token_budget: 1000 },
      { token_budget: 100000 }, { token_budget: newestTwo }, { token_budget: newestTwo - 1 },
      { limit: 5 }, { limit: 3, token_budget: 300 }, { limit: 3, token_budget: 1000 },
      { limit: 2, token_budget: 50 }, { limit: 12, token_budget: 1000 },
      { tag: 'ops' }, { tag: 'pinned', token_budget: 300 }, { tag: 'préférence', token_budget: 120 },
      { tag: 'ops', limit: 2, token_budget: 1000 }, { tag: 'no-such-tag', token_budget: 300 },
    ];
    const coverage = { skippedThenTook: 0, stopped: 0, limitBound: 0, budgetBound: 0, tagged: 0 };
    for (const request of cases) {
      const where = `ListMemory ${JSON.stringify(request)}`;
      const resp = await acme.listMemory({ memory_ref: REF, ...request });
      const want = expectedRecency(records, request);
      assert.equal(resp.rank, 'recency', where);
      assert.equal(resp.token_counter, 'chars', where);
      assert.deepEqual(resp.entries.map((e) => e.id), want.ids, `${where}: the entries the rule gives`);
      assert.equal(resp.left_out_for_budget, want.leftOut, `${where}: left_out_for_budget`);
      assert.equal(resp.tokens_used, want.used, `${where}: tokens_used`);
      assert.equal(resp.tokens_used, resp.entries.reduce((s, e) => s + codePoints(e.content), 0),
        `${where}: tokens_used == recounted sum`);
      assert.equal(resp.tokens_used, resp.entries.reduce((s, e) => s + e.tokens, 0), `${where}: tokens_used == sum`);
      if (request.token_budget !== undefined) {
        assert.ok(resp.tokens_used <= request.token_budget, `${where}: ${resp.tokens_used} <= budget`);
      }
      if (request.limit) assert.ok(resp.entries.length <= request.limit, `${where}: at most limit`);
      const byId = new Map(records.map((r) => [r.id, r]));
      resp.entries.forEach((entry, k) => {
        checkEntry(entry, byId.get(entry.id), `${where} entry ${k}`);
        assert.equal(entry.score, 0, `${where} entry ${k}: no score in a recency answer`);
        if (request.tag) assert.ok(entry.tags.includes(request.tag), `${where} entry ${k} carries the tag`);
        if (k > 0) {
          assert.ok(millis(entry.created_at) <= millis(resp.entries[k - 1].created_at), `${where}: newest first`);
        }
      });

      if (want.skippedThenTook) coverage.skippedThenTook += 1;
      if (request.token_budget !== undefined && want.leftOut > 0 && want.ids.length > 0) coverage.stopped += 1;
      if (request.limit && request.token_budget !== undefined) {
        const unlimited = expectedRecency(records, { ...request, limit: 0 });
        if (unlimited.ids.length > request.limit) coverage.limitBound += 1;
        else if (unlimited.ids.length < request.limit) coverage.budgetBound += 1;
      }
      if (request.tag && want.ids.length > 0) coverage.tagged += 1;
    }
    t.diagnostic(`coverage: ${JSON.stringify(coverage)}`);
    // The cases exercised every branch of the rule.
    for (const [what, count] of Object.entries(coverage)) assert.ok(count >= 1, `coverage ${what}: ${count}`);
  });

  it('ranks by relevance: the buried topic entry comes first, which recency leaves out', async (t) => {
    if (!needsEntries(t)) return;
    const topic = records[TOPIC_INDEX];
    const budget = 300;
    const relevant = await acme.listMemory({ memory_ref: REF, rank: 'relevance', query: TOPIC_QUERY,
      token_budget: budget });
    assert.equal(relevant.rank, 'relevance');
    assert.ok(relevant.entries.length >= 1, 'relevance finds the topic entry');
    assert.equal(relevant.entries[0].id, topic.id, 'the topic entry comes first');
    assert.ok(relevant.entries[0].score > 0, `score ${relevant.entries[0].score} > 0`);
    relevant.entries.forEach((entry, k) => {
      if (k > 0) assert.ok(entry.score <= relevant.entries[k - 1].score, 'scores do not increase');
    });
    assert.equal(relevant.tokens_used, relevant.entries.reduce((s, e) => s + codePoints(e.content), 0));
    assert.ok(relevant.tokens_used <= budget);
    checkEntry(relevant.entries[0], topic, 'relevance entry 0');

    const recent = await acme.listMemory({ memory_ref: REF, rank: 'recency', token_budget: budget });
    assert.ok(!recent.entries.some((e) => e.id === topic.id), 'recency does not reach the topic entry');
    assert.ok(recent.entries.length >= 1);
  });

  it('answers bad list requests with INVALID_ARGUMENT naming the field', async () => {
    assertStatus(await rejection(acme.listMemory({ memory_ref: REF, rank: 'relevance' })),
      status.INVALID_ARGUMENT, 'query');
    assertStatus(await rejection(acme.listMemory({ memory_ref: REF, rank: 'relevance', token_budget: 100 })),
      status.INVALID_ARGUMENT, 'query');
    assertStatus(await rejection(acme.listMemory({ memory_ref: REF, token_budget: 0 })),
      status.INVALID_ARGUMENT, 'token_budget');
    assertStatus(await rejection(acme.listMemory({ memory_ref: REF, rank: 'relevance', query: TOPIC_QUERY,
      token_budget: 0 })), status.INVALID_ARGUMENT, 'token_budget');
    assertStatus(await rejection(acme.listMemory({ memory_ref: REF, token_budget: -5 })),
      status.INVALID_ARGUMENT, 'token_budget');
  });

  it('replaces an entry by id, and deletes one', async () => {
    const ref = 'agent:alpha/scratch';
    const first = await acme.putMemory({ memory_ref: ref, entry_id: 'scratch-1', content: 'première version ✏️' });
    assert.equal(first.replaced, false);
    const second = await acme.putMemory({ memory_ref: ref, entry_id: 'scratch-1', content: '第二版 second',
      tags: ['v2'] });
    assert.deepEqual(second, { entry_id: 'scratch-1', tokens: codePoints('第二版 second'), redacted_secret_ids: [],
      replaced: true });
    const got = await acme.getMemory({ memory_ref: ref, entry_id: 'scratch-1' });
    assert.equal(got.content, '第二版 second');
    assert.deepEqual(got.tags, ['v2']);
    const other = await acme.putMemory({ memory_ref: ref, content: 'to be deleted' });
    await acme.deleteMemory({ memory_ref: ref, entry_id: other.entry_id });
    assertStatus(await rejection(acme.getMemory({ memory_ref: ref, entry_id: other.entry_id })), status.NOT_FOUND);
    assert.deepEqual((await acme.listMemory({ memory_ref: ref })).entries.map((e) => e.id), ['scratch-1']);
  });

  it('CTI-1: another tenant sees nothing of acme\'s memory', async (t) => {
    if (!needsEntries(t)) return;
    for (const request of [{}, { token_budget: 1000 }, { rank: 'relevance', query: TOPIC_QUERY }, { tag: 'ops' }]) {
      const resp = await globex.listMemory({ memory_ref: REF, ...request });
      assert.deepEqual(resp.entries, [], `globex ListMemory ${JSON.stringify(request)}`);
      assert.equal(resp.tokens_used, 0);
      assert.equal(resp.left_out_for_budget, 0);
    }
    for (const record of records) {
      assertStatus(await rejection(globex.getMemory({ memory_ref: REF, entry_id: record.id })), status.NOT_FOUND);
    }
    // Deleting acme's entry answers as deleting an entry that does not exist, and deletes nothing.
    const outcome = async (entryId) => {
      try {
        await globex.deleteMemory({ memory_ref: REF, entry_id: entryId });
        return 'OK';
      } catch (err) {
        return err.code;
      }
    };
    assert.equal(await outcome(records[0].id), await outcome('no-such-entry'));
    // globex's own entry under the same memory_ref, even with acme's entry id, is globex's alone.
    const own = await globex.putMemory({ memory_ref: REF, entry_id: records[3].id, content: 'globex private note' });
    assert.equal(own.replaced, false, 'acme\'s entry with that id does not exist for globex');
    assert.deepEqual((await globex.listMemory({ memory_ref: REF })).entries.map((e) => [e.id, e.content]),
      [[records[3].id, 'globex private note']]);
    checkEntry(await acme.getMemory({ memory_ref: REF, entry_id: records[3].id }), records[3], 'acme still has it');
    const mine = await acme.listMemory({ memory_ref: REF });
    assert.deepEqual(mine.entries.map((e) => e.id), records.map((r) => r.id).reverse(), 'acme\'s memory is intact');
  });

  it('CTI-1: a call without a token, or with an unknown one, is UNAUTHENTICATED', async (t) => {
    const callers = {
      'no token': connect(address),
      'unknown token': connect(address, { token: 'not-a-tenant-token' }),
      'the hash as token': connect(address, { token: sha256Hex(TOKENS.acme) }),
    };
    try {
      for (const [what, client] of Object.entries(callers)) {
        const entryId = records[0] ? records[0].id : 'x';
        // Thunks: each call starts only when awaited, so no rejection is left unhandled.
        const calls = {
          ListMemory: () => client.listMemory({ memory_ref: REF }),
          // Authentication comes first: a bad request does not tell an unauthenticated caller more.
          'ListMemory (token_budget 0)': () => client.listMemory({ memory_ref: REF, token_budget: 0 }),
          GetMemory: () => client.getMemory({ memory_ref: REF, entry_id: entryId }),
          PutMemory: () => client.putMemory({ memory_ref: REF, content: 'intruder' }),
          DeleteMemory: () => client.deleteMemory({ memory_ref: REF, entry_id: entryId }),
          RegisterSecrets: () => client.registerSecrets({ secrets: [{ secret_id: 'x', value: 'xxxxxxxxxx' }] }),
          ForgetSecrets: () => client.forgetSecrets({}),
          OpenRun: () => client.openRun({ run_id: 'intruder-run' }),
        };
        for (const [rpc, call] of Object.entries(calls)) {
          const err = await rejection(call());
          assert.equal(err.code, status.UNAUTHENTICATED, `${what}, ${rpc}: ${err.code} (${err.details})`);
        }
      }
    } finally {
      for (const client of Object.values(callers)) client.close();
    }
    if (stored) {
      const mine = await acme.listMemory({ memory_ref: REF });
      assert.equal(mine.entries.length, ENTRY_COUNT, 'the rejected calls wrote nothing');
      checkEntry(await acme.getMemory({ memory_ref: REF, entry_id: records[0].id }), records[0], 'not deleted');
    } else {
      t.diagnostic('the puts failed: the write check was skipped');
    }
  });

  // With tenants configured *every* call carries the token, even those that read no tenant data.
  it('CTI-1: GetCapabilities and CountTokens without a valid token are UNAUTHENTICATED', async () => {
    const callers = [connect(address), connect(address, { token: 'not-a-tenant-token' })];
    try {
      for (const client of callers) {
        assertStatus(await rejection(client.getCapabilities({})), status.UNAUTHENTICATED);
        assertStatus(await rejection(client.countTokens({ token_counter: 'chars', texts: ['abc'] })),
          status.UNAUTHENTICATED);
      }
    } finally {
      for (const client of callers) client.close();
    }
  });

  it('SR-1: a tenant-wide secret is redacted from memory, for that tenant only', async () => {
    const ref = 'agent:alpha/secrets';
    const secrets = [
      { secret_id: 'db-password', value: 'Tr0ub4dor-zebra-quokka-93' },
      { secret_id: 'clé.api_2', value: 'sécret-日本-🔑-clé' },
    ];
    // secret_id allows A-Z a-z 0-9 _ . - only: the accented id is refused, naming the field.
    assertStatus(await rejection(acme.registerSecrets({ secrets: [secrets[1]] })), status.INVALID_ARGUMENT,
      'secret_id');
    secrets[1] = { ...secrets[1], secret_id: 'cle.api_2' };
    assert.deepEqual(await acme.registerSecrets({ secrets }), { registered: 2 });

    const [pw, key] = secrets;
    const content = `Login: psql with ${pw.value} — ne pas partager 🙊; again ${pw.value}; clé ${key.value}.`;
    const redacted = content.replaceAll(pw.value, `[REDACTED:${pw.secret_id}]`)
      .replaceAll(key.value, `[REDACTED:${key.secret_id}]`);
    const put = await acme.putMemory({ memory_ref: ref, content, tags: ['creds'] });
    assert.deepEqual([...put.redacted_secret_ids].sort(), [pw.secret_id, key.secret_id].sort());
    assert.equal(put.tokens, codePoints(redacted), 'tokens of the redacted content');
    const got = await acme.getMemory({ memory_ref: ref, entry_id: put.entry_id });
    assert.equal(got.content, redacted);
    const listed = await acme.listMemory({ memory_ref: ref, token_budget: 1000 });
    assert.deepEqual(listed.entries.map((e) => e.content), [redacted]);
    for (const text of [got.content, listed.entries[0].content, JSON.stringify(listed)]) {
      assert.ok(!text.includes(pw.value) && !text.includes(key.value), 'the values are never returned');
    }
    // Nor can the values be found: the index holds the redacted content.
    const search = await acme.listMemory({ memory_ref: ref, rank: 'relevance', query: 'Tr0ub4dor zebra quokka' });
    assert.deepEqual(search.entries, [], 'a search for the secret value finds nothing');

    // acme's secrets are acme's: globex's content is stored as globex wrote it.
    const theirs = await globex.putMemory({ memory_ref: ref, content: `globex text ${pw.value}` });
    assert.deepEqual(theirs.redacted_secret_ids, []);
    assert.equal((await globex.getMemory({ memory_ref: ref, entry_id: theirs.entry_id })).content,
      `globex text ${pw.value}`);

    // Forgotten secrets are no longer redacted from what is written afterwards; what was stored stays redacted.
    assert.deepEqual(await acme.forgetSecrets({ secret_ids: [pw.secret_id] }), { forgotten: 1 });
    const after = await acme.putMemory({ memory_ref: ref, content: `now ${pw.value} and ${key.value}` });
    assert.deepEqual(after.redacted_secret_ids, [key.secret_id]);
    assert.equal((await acme.getMemory({ memory_ref: ref, entry_id: after.entry_id })).content,
      `now ${pw.value} and [REDACTED:${key.secret_id}]`);
    assert.equal((await acme.getMemory({ memory_ref: ref, entry_id: put.entry_id })).content, redacted);
    assert.deepEqual(await acme.forgetSecrets({}), { forgotten: 1 }, 'an empty list forgets the rest');
  });

  it('stops cleanly on SIGTERM', async () => {
    for (const client of [acme, globex]) client.close();
    acme = null;
    globex = null;
    await stopWithSigterm(sidecar);
  });
});
