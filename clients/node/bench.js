// The clients' common bench protocol (benchmarks/_lib/client_bench.py says it in full), through
// the package as built (dist/, `npm run build`): a run of 200 events, then N rounds of the
// client's health Check and an AssembleContext re-assembling iteration 50 under 8000 tokens,
// each call timed; one line of JSON out.
//
//   node clients/node/bench.js --target 127.0.0.1:50051 [--rounds 300]

import { connect } from '@context-sidecar/client';

const WORDS = ('refund policy kettle order shipping invoice customer damaged clause days warranty receipt the a '
  + 'within agent reads file calls tool search summary token cache').split(' ');
const EVENTS = 200;
const PER_TURN = 4;
const BUDGET = 8000;

// The C library's old rand(), so every language writes the same text: Math.imul keeps the low
// 32 bits of the product, and the mask keeps them mod 2**31.
function content(i) {
  const words = [];
  let state = i + 1;
  for (let j = 0; j < 60; j++) {
    state = (Math.imul(state, 1103515245) + 12345) & 0x7fffffff;
    words.push(WORDS[(state >> 16) % WORDS.length]);
  }
  return words.join(' ');
}

function option(name, fallback) {
  const at = process.argv.indexOf(name);
  if (at === -1) return fallback;
  if (at + 1 >= process.argv.length) throw new Error(`${name} needs a value`);
  return process.argv[at + 1];
}

function p50us(nanoseconds) {
  const sorted = [...nanoseconds].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  return Math.round(Number(sorted[Math.floor(sorted.length / 2)]) / 100) / 10;
}

async function main() {
  const target = option('--target');
  if (!target) throw new Error('--target HOST:PORT is required');
  const rounds = Number(option('--rounds', '300'));
  const runId = 'bench-node';
  const client = connect(target);
  try {
    await client.openRun({ run_id: runId, token_counter: 'o200k_base', transcript_token_budget: BUDGET });
    const events = [];
    for (let i = 0; i < EVENTS; i++) {
      events.push({ event_id: `e${i}`, iteration: Math.floor(i / PER_TURN) + 1, role: i % 2 ? 'assistant' : 'user',
        content: content(i) });
    }
    await client.appendEvents({ run_id: runId, events });
    const last = Math.floor((EVENTS - 1) / PER_TURN) + 1;
    await client.assembleContext({ run_id: runId, iteration: last });
    const healthTimes = [];
    const assembleTimes = [];
    for (let round = 0; round < rounds; round++) {
      let started = process.hrtime.bigint();
      await client.checkHealth();
      healthTimes.push(process.hrtime.bigint() - started);
      started = process.hrtime.bigint();
      await client.assembleContext({ run_id: runId, iteration: last, max_transcript_tokens: BUDGET });
      assembleTimes.push(process.hrtime.bigint() - started);
    }
    console.log(JSON.stringify({ client: 'node', health_p50_us: p50us(healthTimes),
      assemble_p50_us: p50us(assembleTimes), rounds }));
  } finally {
    client.close();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
