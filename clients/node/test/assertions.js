// Test helper (not a test): the assertions every test file makes about a failed call.

import assert from 'node:assert/strict';

/** `err` is a gRPC error with status `code`, and its details name `fieldWord` (when given). */
function assertStatus(err, code, fieldWord) {
  assert.ok(err && typeof err.code === 'number', `expected a gRPC error, got ${err}`);
  assert.equal(err.code, code, `status ${err.code} (${err.details}), expected ${code}`);
  if (fieldWord) assert.ok(err.details.includes(fieldWord), `"${err.details}" names ${fieldWord}`);
  return err;
}

/**
 * `err` carries the machine code `reason` (the ErrorInfo in its google.rpc.Status details). The
 * details are a serialized proto: a string field's UTF-8 bytes appear in it verbatim.
 */
function assertReason(err, reason) {
  const details = err.metadata.get('grpc-status-details-bin')[0];
  assert.ok(Buffer.isBuffer(details) && details.includes(reason), `the error's details carry the reason ${reason}`);
  return err;
}

/** The error `promise` rejects with; fails the test if it resolves. */
async function rejection(promise) {
  try {
    await promise;
  } catch (err) {
    return err;
  }
  assert.fail('the call succeeded; an error status was expected');
}

export { assertStatus, assertReason, rejection };
