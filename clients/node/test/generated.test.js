// src/gen/ is committed (a user building the package needs no protoc): it must be what the
// generator makes from the contract today, so an edited proto without a regeneration fails here.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const PACKAGE = path.join(import.meta.dirname, '..');

function filesUnder(root) {
  return fs.readdirSync(root, { recursive: true }).filter((name) => fs.statSync(path.join(root, name)).isFile()).sort();
}

describe('the generated code', () => {
  let tmpDir;
  before(() => { tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'sidecar-gen-')); });
  after(() => { if (tmpDir) fs.rmSync(tmpDir, { recursive: true, force: true }); });

  it('is what scripts/generate.sh makes from proto/ and third_party/', () => {
    execFileSync(path.join(PACKAGE, 'scripts', 'generate.sh'), [tmpDir], { cwd: PACKAGE, stdio: 'pipe' });
    const committed = path.join(PACKAGE, 'src', 'gen');
    assert.deepEqual(filesUnder(tmpDir), filesUnder(committed));
    for (const name of filesUnder(committed)) {
      assert.equal(fs.readFileSync(path.join(tmpDir, name), 'utf8'), fs.readFileSync(path.join(committed, name), 'utf8'),
        `src/gen/${name} is stale: run npm run generate`);
    }
  });
});
