// One tandem-agent for a node:test file: the tiny model generated into a
// temporary directory, the agent on 127.0.0.1 port 0 (--port-file), ready
// once /readyz answers 200; stopped with SIGTERM, which must exit 0.
//
// Binaries come from $TANDEM_BIN_DIR (CTest sets it), else ../../../build/bin
// relative to this file. node_modules must exist: `npm ci --prefix tests/agent/node`
// (./tandem test runs it when missing); a missing install or binary is a
// failure with the fix in the message, never a skip.

import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const binDir = process.env.TANDEM_BIN_DIR || path.resolve(here, '../../../build/bin');
export const kModel = 'tiny';
const kStartTimeoutMs = 30_000;
const kStopTimeoutMs = 40_000;

if (!existsSync(path.join(here, 'node_modules', 'openai', 'package.json'))) {
  throw new Error(
    `${path.join(here, 'node_modules')} has no 'openai' package: run ` +
      '`npm ci --prefix tests/agent/node` in the checkout (./tandem test does this when node_modules is missing)',
  );
}
export const { default: OpenAI } = await import('openai');

for (const bin of ['tandem-agent', 'tandem-make-model']) {
  if (!existsSync(path.join(binDir, bin))) {
    throw new Error(`${path.join(binDir, bin)} not found: build it, or set TANDEM_BIN_DIR to the directory holding it`);
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Starts the agent. `prepare(tmp, modelDir)`, if given, runs after the model
// is written and returns extra agent flags. Resolves to
// { client, port, stop } where stop() must be awaited in after().
export async function startAgent({ prepare } = {}) {
  const tmp = mkdtempSync(path.join(tmpdir(), 'tandem-node-'));
  const modelDir = path.join(tmp, kModel); // the model id is the directory's base name
  execFileSync(path.join(binDir, 'tandem-make-model'), ['--out', modelDir], { stdio: 'pipe' });
  const extraArgs = prepare ? prepare(tmp, modelDir) : [];

  const portFile = path.join(tmp, 'port');
  const agent = spawn(
    path.join(binDir, 'tandem-agent'),
    ['--model-dir', modelDir, '--listen', '127.0.0.1:0', '--port-file', portFile, '--log-level', 'warn', ...extraArgs],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let agentLog = ''; // its stdout and stderr, shown when something fails
  agent.stdout.on('data', (d) => (agentLog += d));
  agent.stderr.on('data', (d) => (agentLog += d));
  const exited = new Promise((resolve) => agent.on('exit', (code, signal) => resolve({ code, signal })));
  let running = true;
  exited.then(() => (running = false));
  const failWithLog = (message) => new Error(`${message}\n--- tandem-agent output ---\n${agentLog}`);

  async function stop() {
    try {
      if (agent.exitCode === null && agent.signalCode === null) {
        agent.kill('SIGTERM');
        let timer;
        const timeout = new Promise((resolve) => (timer = setTimeout(() => resolve('timeout'), kStopTimeoutMs)));
        const result = await Promise.race([exited, timeout]);
        clearTimeout(timer); // a pending timer would keep this process alive
        if (result === 'timeout') {
          agent.kill('SIGKILL');
          throw failWithLog(`tandem-agent did not exit within ${kStopTimeoutMs} ms of SIGTERM`);
        }
        assert.deepEqual(result, { code: 0, signal: null }, `tandem-agent's exit after SIGTERM\n${agentLog}`);
      } else {
        throw failWithLog(
          `tandem-agent exited before the end of the tests (code ${agent.exitCode}, signal ${agent.signalCode})`,
        );
      }
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
  }

  const deadline = Date.now() + kStartTimeoutMs;
  let port;
  while (Date.now() < deadline) {
    if (!running) {
      rmSync(tmp, { recursive: true, force: true });
      throw failWithLog('tandem-agent exited during start-up');
    }
    if (port === undefined && existsSync(portFile)) port = Number(readFileSync(portFile, 'utf8').split('\n')[0].trim());
    if (port !== undefined) {
      try {
        const r = await fetch(`http://127.0.0.1:${port}/readyz`);
        if (r.status === 200) break;
      } catch {
        // not accepting yet
      }
    }
    await sleep(50);
  }
  if (Date.now() >= deadline) {
    agent.kill('SIGKILL');
    rmSync(tmp, { recursive: true, force: true });
    throw failWithLog(`tandem-agent not ready within ${kStartTimeoutMs} ms`);
  }
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused' });
  return { client, port, stop };
}
