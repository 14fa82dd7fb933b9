// TLS and mTLS through connect's `tls` option, against two real sidecars serving [server.tls] with
// certificates made for this run (tests/certificates.py): one with TLS, one with mTLS (a client CA
// set), both with a tenant. The right CA (and under mTLS a certificate that CA signed) gets a turn
// assembled with the tenant's token; a client trusting another CA is refused, and under mTLS so
// is one without a certificate or with another CA's. A bad option is an error of connect.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { connect, status, UnauthenticatedError, UnavailableError } from '@context-sidecar/client';
import { startSidecar, killSidecar, makeCertificates } from './sidecar.js';
import { rejection } from './assertions.js';

const TOKEN = `tls-${crypto.randomBytes(18).toString('base64url')}`;
// A refused connection is UNAVAILABLE, which the client retries for a read: not here.
const ONCE = { retries: 0, deadlineMs: 20_000 };

describe('TLS and mTLS (Node.js client)', () => {
  let tmpDir;
  let certs;
  let tlsSidecar;
  let mtlsSidecar;
  let tlsAddress;
  let mtlsAddress;
  const clients = [];

  /** A client closed after the tests. */
  function open(address, options) {
    const client = connect(address, { token: TOKEN, ...options });
    clients.push(client);
    return client;
  }

  /** The refusal of `client`'s first call: an UnavailableError that never reached the sidecar. */
  async function refusal(client) {
    const error = await rejection(client.getCapabilities({}, ONCE));
    assert.ok(error instanceof UnavailableError, `expected UnavailableError, got ${error}`);
    assert.equal(error.code, status.UNAVAILABLE);
    assert.equal(error.reason, '', 'the call never reached the sidecar');
    return error;
  }

  before(async () => {
    tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'sidecar-tls-'));
    certs = makeCertificates(path.join(tmpDir, 'certificates'));
    const config = path.join(tmpDir, 'sidecar.toml');
    const tokenSha256 = crypto.createHash('sha256').update(TOKEN).digest('hex');
    fs.writeFileSync(config, `[[auth.tenants]]\nid = "host"\ntoken_sha256 = "${tokenSha256}"\n`);
    const serverFlags = ['--config', config, '--tls-cert-file', certs.pem('server'),
      '--tls-key-file', certs.key('server')];
    // A free loopback port each: the server certificate names 127.0.0.1.
    for (const name of ['tls', 'mtls']) fs.mkdirSync(path.join(tmpDir, name));
    tlsSidecar = startSidecar(path.join(tmpDir, 'tls'), serverFlags, { listen: '127.0.0.1:0' });
    mtlsSidecar = startSidecar(path.join(tmpDir, 'mtls'),
      [...serverFlags, '--tls-client-ca-file', certs.pem('ca')], { listen: '127.0.0.1:0' });
    [tlsAddress, mtlsAddress] = await Promise.all([tlsSidecar.ready, mtlsSidecar.ready]);
  });

  after(async () => {
    for (const client of clients) client.close();
    await Promise.all([killSidecar(tlsSidecar), killSidecar(mtlsSidecar)]);
    if (tmpDir) fs.rmSync(tmpDir, { recursive: true, force: true });
  });

  /** Open a run and assemble its first turn through `client`: the window holds what was sent. */
  async function assembleOneTurn(client, runId) {
    assert.equal((await client.openRun({ run_id: runId, token_counter: 'chars' })).created, true);
    const content = `a question sent over TLS to ${runId}`;
    const turn = await client.assembleContext({ run_id: runId, iteration: 1,
      append_events: [{ event_id: 'q1', role: 'user', content }] });
    assert.deepEqual(turn.entries.map((entry) => [entry.event_id, entry.text]), [['q1', content]]);
  }

  it('assembles a turn over TLS with the CA, the token naming the tenant', async () => {
    await assembleOneTurn(open(tlsAddress, { tls: { caFile: certs.pem('ca') } }), 'over-tls');
    // The token still travels (and is checked) over TLS: without it the sidecar refuses the call.
    const anonymous = connect(tlsAddress, { tls: { caFile: certs.pem('ca') } });
    clients.push(anonymous);
    const error = await rejection(anonymous.getCapabilities({}, ONCE));
    assert.ok(error instanceof UnauthenticatedError, `expected UnauthenticatedError, got ${error}`);
  });

  it('refuses a sidecar whose certificate another CA signed (a client trusting only other-ca.pem)', async () => {
    const error = await refusal(open(tlsAddress, { tls: { caFile: certs.pem('other-ca') } }));
    assert.match(error.details, /certificate/i, 'the refusal says it was the certificate');
  });

  it('refuses a plaintext client of a TLS sidecar', async () => {
    await refusal(open(tlsAddress));
  });

  it('assembles a turn over mTLS with the CA and a client certificate it signed', async () => {
    await assembleOneTurn(open(mtlsAddress, { tls: { caFile: certs.pem('ca'), certFile: certs.pem('client'),
      keyFile: certs.key('client') } }), 'over-mtls');
  });

  it('is refused under mTLS without a client certificate', async () => {
    await refusal(open(mtlsAddress, { tls: { caFile: certs.pem('ca') } }));
  });

  it('is refused under mTLS with a client certificate another CA signed', async () => {
    await refusal(open(mtlsAddress, { tls: { caFile: certs.pem('ca'), certFile: certs.pem('other-client'),
      keyFile: certs.key('other-client') } }));
  });

  it('refuses at connect a certificate without its key, or with another one\'s', () => {
    const caFile = certs.pem('ca');
    assert.throws(() => connect(mtlsAddress, { tls: { caFile, certFile: certs.pem('client') } }),
      { name: 'TypeError', message: /certFile and tls.keyFile go together/ });
    assert.throws(() => connect(mtlsAddress, { tls: { caFile, keyFile: certs.key('client') } }),
      { name: 'TypeError', message: /certFile and tls.keyFile go together/ });
    const mismatched = { caFile, certFile: certs.pem('client'), keyFile: certs.key('other-client') };
    assert.throws(() => connect(mtlsAddress, { tls: mismatched }), (error) => {
      assert.ok(error.message.includes(certs.pem('client')) && error.message.includes(certs.key('other-client')),
        `the error names both files: ${error.message}`);
      assert.match(error.message, /not a PEM certificate chain and its private key/);
      return true;
    });
  });

  it('refuses at connect a file it cannot read, or a CA file holding no certificate', () => {
    const absent = path.join(tmpDir, 'absent.pem');
    assert.throws(() => connect(tlsAddress, { tls: { caFile: absent } }),
      { message: new RegExp(`^tls\\.caFile: cannot read ${absent.replace(/[.]/g, '\\.')}: ENOENT`) });
    assert.throws(() => connect(tlsAddress, { tls: { caFile: certs.pem('ca'), certFile: certs.pem('client'),
      keyFile: absent } }), { message: /^tls\.keyFile: cannot read .*absent\.pem/ });
    assert.throws(() => connect(tlsAddress, { tls: { caFile: certs.key('client') } }),
      { message: /^tls\.caFile: .*client\.key holds no PEM certificate/ });
  });
});
