// The Vercel AI SDK middleware end to end: generateText with tools, over the SDK's own mock model,
// against a real sidecar. What the model receives at each step must be the window the sidecar
// fed for that step's iteration (GetTranscriptWindow), not the host's history.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { generateText, jsonSchema, stepCountIs, streamText, tool, wrapLanguageModel } from 'ai';
import { convertArrayToReadableStream, MockLanguageModelV3 } from 'ai/test';

import { connect } from '@context-sidecar/client';
import { sidecarContext } from '@context-sidecar/client/ai-sdk';
import { startSidecar, killSidecar, stopWithSigterm } from './sidecar.js';
import { TOOL_WORDS, textGenerator } from './text.js';

const RUN_ID = 'ai-sdk-chat';
const BUDGET = 3000; // chars: three turns of ~1,300 do not fit, so the window must leave some out
const SYSTEM = 'You answer from the lookup tool.';
const USAGE = { inputTokens: { total: 10, noCache: 10, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 5, text: 5, reasoning: 0 } };

/** The mock's answers: every odd call asks the lookup tool, every even one answers in text. */
function mockModel() {
  let calls = 0;
  return new MockLanguageModelV3({
    doGenerate: async () => {
      calls += 1;
      const content = calls % 2 === 1
        ? [{ type: 'tool-call', toolCallId: `call-${calls}`, toolName: 'lookup', input: JSON.stringify({ q: `topic ${calls}` }) }]
        : [{ type: 'text', text: `Answer ${calls}: the policy allows it.` }];
      return { content, finishReason: { unified: calls % 2 === 1 ? 'tool-calls' : 'stop', raw: undefined },
        usage: USAGE, warnings: [] };
    },
  });
}

/** A prompt's history (after the system message) as (role, text) per part, the way the sidecar
 * holds it: a tool call's text is its arguments' JSON, a result's its text. */
function promptParts(prompt) {
  return prompt.filter((message) => message.role !== 'system').flatMap((message) => message.content.map((part) => {
    if (part.type === 'text') return { role: message.role, text: part.text };
    if (part.type === 'tool-call') return { role: message.role, text: JSON.stringify(part.input) };
    if (part.type === 'tool-result') return { role: message.role, text: part.output.value };
    throw new Error(`unexpected part ${part.type}`);
  }));
}

describe('the AI SDK middleware over a real sidecar', () => {
  let tmpDir;
  let sidecar;
  let client;

  before(async () => {
    tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'sidecar-ai-sdk-'));
    sidecar = startSidecar(tmpDir, ['--token-counter', 'chars']);
    client = connect(await sidecar.ready);
  });

  after(async () => {
    if (client) client.close();
    await killSidecar(sidecar); // only if a failure skipped the clean stop below
    if (tmpDir) fs.rmSync(tmpDir, { recursive: true, force: true });
  });

  it('feeds each step the window the sidecar fed, across chat requests', async () => {
    const { randomText } = textGenerator(7, TOOL_WORDS);
    const lookup = tool({
      description: 'Looks a topic up.',
      inputSchema: jsonSchema({ type: 'object', properties: { q: { type: 'string' } }, required: ['q'] }),
      execute: async ({ q }) => `${q}: ${randomText(1000)}`,
    });
    const settings = { token_counter: 'chars', transcript_token_budget: BUDGET };
    let messages = [];
    const received = []; // every model call's prompt, in order
    for (const question of ['Can I return a kettle?', 'And a toaster?', 'What about a blender?']) {
      // A new middleware per request, as a chat route makes one: it finds where the run ends.
      const model = mockModel();
      messages = [...messages, { role: 'user', content: question }];
      const result = await generateText({
        model: wrapLanguageModel({ model, middleware: sidecarContext(client, { run_id: RUN_ID, settings }) }),
        system: SYSTEM, messages, tools: { lookup }, stopWhen: stepCountIs(3),
      });
      assert.equal(model.doGenerateCalls.length, 2, 'a tool step, then the answer');
      received.push(...model.doGenerateCalls.map((call) => call.prompt));
      messages = [...messages, ...result.response.messages];
    }

    const { events } = await client.listRunEvents({ run_id: RUN_ID, limit: 1000 });
    const roles = new Map(events.map((event) => [event.event_id, event.role]));
    // The question, the tool call, its result and the answer, each recorded once, in the turn of the
    // first model call that sees it: the last answer, which no call has seen yet, is not recorded.
    assert.deepEqual(events.map((event) => [event.event_id, event.role, event.iteration]), [
      ['m0.0', 'user', 1], ['m1.0', 'assistant', 2], ['m2.0', 'tool', 2],
      ['m3.0', 'assistant', 3], ['m4.0', 'user', 3], ['m5.0', 'assistant', 4], ['m6.0', 'tool', 4],
      ['m7.0', 'assistant', 5], ['m8.0', 'user', 5], ['m9.0', 'assistant', 6], ['m10.0', 'tool', 6]]);
    assert.equal(received.length, 6);
    let leftOut = 0;
    for (const [index, prompt] of received.entries()) {
      const fed = await client.getTranscriptWindow({ run_id: RUN_ID, iteration: index + 1 });
      assert.deepEqual(prompt[0], { role: 'system', content: SYSTEM }, 'the host\'s instructions pass through');
      assert.deepEqual(promptParts(prompt), fed.entries.map((entry) => ({ role: roles.get(entry.event_id), text: entry.rendered })),
        `iteration ${index + 1}: the model received the sidecar's window`);
      assert.ok(fed.token_count <= BUDGET, `iteration ${index + 1}: ${fed.token_count} <= ${BUDGET}`);
      const counted = (await client.countTokens({ token_counter: 'chars', texts: promptParts(prompt).map((part) => part.text) })).counts;
      assert.equal(counted.reduce((sum, count) => sum + count, 0), fed.token_count, 'the prompt is the counted window');
      leftOut = events.filter((event) => event.iteration <= index + 1).length - fed.entries.length;
    }
    assert.ok(leftOut > 0, 'the last window left older events out');
    assert.equal(promptParts(received.at(-1)).some((part) => part.text === 'Can I return a kettle?'), false,
      'the first question is no longer fed');
  });

  it('feeds a streamed call the window too', async () => {
    const model = new MockLanguageModelV3({
      doStream: async () => ({ stream: convertArrayToReadableStream([
        { type: 'stream-start', warnings: [] }, { type: 'text-start', id: 't' },
        { type: 'text-delta', id: 't', delta: 'Streamed.' }, { type: 'text-end', id: 't' },
        { type: 'finish', finishReason: { unified: 'stop', raw: undefined }, usage: USAGE }]) }),
    });
    const run_id = 'ai-sdk-stream';
    const result = streamText({ model: wrapLanguageModel({ model, middleware: sidecarContext(client, { run_id,
      settings: { token_counter: 'chars', transcript_token_budget: BUDGET } }) }), system: SYSTEM, prompt: 'Stream it.' });
    assert.equal(await result.text, 'Streamed.');
    const fed = await client.getTranscriptWindow({ run_id, iteration: 1 });
    assert.deepEqual(fed.entries.map((entry) => entry.rendered), ['Stream it.']);
    assert.deepEqual(model.doStreamCalls.map((call) => call.prompt),
      [[{ role: 'system', content: SYSTEM }, { role: 'user', content: [{ type: 'text', text: 'Stream it.' }] }]]);
  });

  it('refuses a history shorter than the run holds', async () => {
    const middleware = sidecarContext(client, { run_id: RUN_ID });
    const model = wrapLanguageModel({ model: mockModel(), middleware });
    await assert.rejects(generateText({ model, prompt: 'Hello again' }), /holds 11 messages of this conversation, the prompt 1/);
  });

  it('refuses a history that does not extend what the run holds', async () => {
    // As long as the recorded one, but its last message is not the recorded tool result.
    const messages = Array.from({ length: 12 }, (_, i) => ({ role: 'user', content: `message ${i}` }));
    const model = wrapLanguageModel({ model: mockModel(), middleware: sidecarContext(client, { run_id: RUN_ID }) });
    await assert.rejects(generateText({ model, messages }),
      /recorded message 10 of this conversation as \["m10.0 tool tool_result call-1 "\], the prompt has \["m10.0 user message  "\] there/);
    const { events } = await client.listRunEvents({ run_id: RUN_ID, limit: 1000 });
    assert.equal(events.length, 11, 'nothing was recorded');
  });

  it('stops cleanly on SIGTERM', async () => {
    client.close();
    client = null;
    await stopWithSigterm(sidecar);
  });
});
