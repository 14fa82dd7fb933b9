import { connect, InvalidArgumentError } from '@context-sidecar/client';

const sidecar = connect(process.env.SIDECAR_ADDRESS ?? '127.0.0.1:50051'); // { token }: when it has tenants
await sidecar.openRun({ run_id: 'run-1', token_counter: 'o200k_base', transcript_token_budget: 8000 });
const turn = await sidecar.assembleContext({ run_id: 'run-1', iteration: 2, append_events: [
  { event_id: 'u1', iteration: 1, role: 'user', content: 'Hi, I bought a kettle.' }, // earlier history
  { event_id: 'u2', role: 'user', content: 'What does the refund policy say?' },
  { event_id: 'c2', role: 'assistant', type: 'tool_call', call_id: 'k2', tool_name: 'search', content: '{"q": "refund"}' },
  { event_id: 'r2', role: 'tool', type: 'tool_result', call_id: 'k2', content: '30 days.' }] });
console.log(turn.token_count, turn.token_budget, turn.entries.map((e) => [e.event_id, e.tokens]));
try {
  await sidecar.countTokens({ token_counter: 'bpe', texts: ['hi'] });
} catch (error) {
  if (!(error instanceof InvalidArgumentError)) throw error;
  console.log(error.reason, error.fieldViolations.map((v) => v.field)); // validation_error [ 'token_counter' ]
}
sidecar.close();
