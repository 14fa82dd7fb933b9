// One turn of a host, and a refused call decoded. The sidecar is at $SIDECAR_ADDRESS
// (127.0.0.1:50051 when unset); $SIDECAR_TOKEN is the tenant's token, if it has tenants.
import { connect, SidecarError, status } from '@context-sidecar/client';

const sidecar = connect(process.env.SIDECAR_ADDRESS ?? '127.0.0.1:50051', { token: process.env.SIDECAR_TOKEN });
await sidecar.openRun({ run_id: 'run-1', token_counter: 'o200k_base', transcript_token_budget: 8000 });
const turn = await sidecar.assembleContext({ run_id: 'run-1', iteration: 1, append_events: [
  { event_id: 'u1', role: 'user', content: 'What does the refund policy say?' },
  { event_id: 'c1', role: 'assistant', type: 'tool_call', call_id: 'k1', tool_name: 'search', content: '{"q": "refund"}' },
  { event_id: 'r1', role: 'tool', type: 'tool_result', call_id: 'k1', content: '30 days.' }] });
for (const entry of turn.entries) console.log(entry.event_id, entry.tokens, 'tokens');

try {
  await sidecar.appendEvents({ run_id: 'run-1', events: [{ role: 'user' }] });
} catch (error) {
  if (!(error instanceof SidecarError)) throw error;
  console.log(status[error.code], error.reason); // InvalidArgumentError is its class
  for (const { field, description } of error.fieldViolations) console.log(field, description);
}
sidecar.close();
