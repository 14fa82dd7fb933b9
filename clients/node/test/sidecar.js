// Test helper (not a test; `npm test` runs test/*.test.js): start a real sidecar process for one
// test file.

import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import path from 'node:path';
import readline from 'node:readline';

const REPO_ROOT = path.join(import.meta.dirname, '..', '..', '..');
const PYTHON = process.env.SIDECAR_PYTHON || 'python';
const READY_TIMEOUT_MS = 30000;

/**
 * Start `python -m sidecar serve` listening on a unix socket in `tmpDir` (or on `listen`, e.g.
 * '127.0.0.1:0' for a free loopback port), storing in `tmpDir/data`, with `flags` (e.g.
 * ['--token-counter', 'chars']) after the common ones.
 *
 * Returns { child, ready, exited, address, stderr() }: `ready` resolves to the address from the
 * sidecar's "serving on" line (rejects if it exits first or is not ready in time), `exited`
 * resolves to { code, signal } once the process is gone and its stderr read to the end.
 */
function startSidecar(tmpDir, flags = [], { listen = `unix://${path.join(tmpDir, 'sidecar.sock')}` } = {}) {
  const args = ['-m', 'sidecar', 'serve', '--listen', listen,
    '--storage-path', path.join(tmpDir, 'data'), '--log-level', 'WARNING', ...flags];
  // cwd is the repository root so `-m sidecar` resolves even without an installed package.
  const child = spawn(PYTHON, args, { cwd: REPO_ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (chunk) => { stderr += chunk; });
  // 'close' rather than 'exit': by then stderr has been read to the end.
  const exited = new Promise((resolve) => {
    child.on('close', (code, signal) => resolve({ code, signal }));
  });

  const ready = new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      reject(new Error(`sidecar not ready after ${READY_TIMEOUT_MS} ms; stderr:\n${stderr}`));
    }, READY_TIMEOUT_MS);
    const lines = readline.createInterface({ input: child.stdout });
    lines.on('line', (line) => {
      const match = /^context-sidecar serving on (\S+)$/.exec(line.trim());
      if (match) {
        clearTimeout(timer);
        resolve(match[1]);
      }
    });
    child.on('error', (err) => {
      clearTimeout(timer);
      reject(new Error(`cannot start ${PYTHON}: ${err.message}`));
    });
    exited.then(({ code, signal }) => {
      clearTimeout(timer);
      // After the ready line this rejection is ignored: the promise is already settled.
      reject(new Error(`sidecar exited early (code ${code}, signal ${signal}); stderr:\n${stderr}`));
    });
  });

  return { child, ready, exited, address: listen, stderr: () => stderr };
}

/** Kill the sidecar if it is still running (after a failure skipped its clean stop). */
async function killSidecar(sidecar) {
  if (sidecar && sidecar.child.pid && sidecar.child.exitCode === null && sidecar.child.signalCode === null) {
    sidecar.child.kill('SIGKILL');
    await sidecar.exited;
  }
}

/** SIGTERM the sidecar and assert that it drained and exited 0 by itself. */
async function stopWithSigterm(sidecar) {
  sidecar.child.kill('SIGTERM');
  const { code, signal } = await sidecar.exited;
  assert.equal(signal, null, `exited by signal ${signal}; stderr:\n${sidecar.stderr()}`);
  assert.equal(code, 0, `exit code ${code}; stderr:\n${sidecar.stderr()}`);
}

/**
 * Write a fresh CA and its certificates into `folder` (tests/certificates.py, as every suite's TLS
 * tests use): returns `pem(stem)` and `key(stem)`, the paths of e.g. 'ca', 'server', 'client',
 * 'other-ca', 'other-client'.
 */
function makeCertificates(folder) {
  const made = spawnSync(PYTHON, ['-m', 'tests.certificates', folder], { cwd: REPO_ROOT, encoding: 'utf8' });
  assert.equal(made.status, 0, `python -m tests.certificates failed: ${made.error ?? made.stderr}`);
  return { pem: (stem) => path.join(folder, `${stem}.pem`), key: (stem) => path.join(folder, `${stem}.key`) };
}

export { startSidecar, killSidecar, stopWithSigterm, makeCertificates, REPO_ROOT, PYTHON };
