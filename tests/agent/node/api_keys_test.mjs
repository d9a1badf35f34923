// API keys and per-key limits of tandem-agent's public API
// (docs/api-keys.md), driven by the official `openai` npm client (the
// version pinned in package.json): what a real application sees when its key
// is missing, wrong or revoked (AuthenticationError, 401 invalid_api_key),
// over its rate limit (RateLimitError, 429 rate_limit_exceeded with
// Retry-After, which the client's own retry honours) or over its concurrency
// limit (429 concurrency_limit_exceeded; the slot comes back when a request
// finishes, fails or its client hangs up).
//
// Starts one tandem-agent on 127.0.0.1 port 0 with the built-in tiny model
// and a keys file written from `tandem-agent hash-api-key`'s output (so the
// file never holds a key), re-read every 200 ms. Waits are for events (a
// status, a metric), polled with generous deadlines; the only timed
// behaviour is the client's retry after Retry-After.
//
// Binaries come from $TANDEM_BIN_DIR (CTest sets it), else ../../../build/bin
// relative to this file. node_modules must exist: `npm ci --prefix tests/agent/node`.
// Run by hand:
//   TANDEM_BIN_DIR=build/bin node --test tests/agent/node/api_keys_test.mjs

import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const binDir = process.env.TANDEM_BIN_DIR || path.resolve(here, '../../../build/bin');
const kModel = 'tiny';
const kStartTimeoutMs = 30_000;
const kStopTimeoutMs = 40_000;
const kEventTimeoutMs = 20_000; // a deadline for something that normally happens in milliseconds

if (!existsSync(path.join(here, 'node_modules', 'openai', 'package.json'))) {
  throw new Error(
    `${path.join(here, 'node_modules')} has no 'openai' package: run ` +
      '`npm ci --prefix tests/agent/node` in the checkout (./tandem test does this when node_modules is missing)',
  );
}
const { default: OpenAI } = await import('openai');

for (const bin of ['tandem-agent', 'tandem-make-model']) {
  if (!existsSync(path.join(binDir, bin))) {
    throw new Error(`${path.join(binDir, bin)} not found: build it, or set TANDEM_BIN_DIR to the directory holding it`);
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// The keys: each test uses its own, so their limits do not interact.
const keys = {
  open: 'sk-test-open-0123456789abcdef', // no limits
  revoked: 'sk-test-revoked-0123456789abcdef', // removed from the file in the revocation test
  slow: 'sk-test-slow-0123456789abcdef', // 0.5 requests per second, burst 1
  single: 'sk-test-single-0123456789abcdef', // one request in flight
};
const limits = {
  open: '',
  revoked: '',
  slow: '  requests_per_second: 0.5\n  burst: 1\n',
  single: '  max_concurrent: 1\n',
};

let tmp;
let keysFile;
let agent;
let agentLog = '';
let exited;
let baseURL;

function failWithLog(message) {
  return new Error(`${message}\n--- tandem-agent output ---\n${agentLog}`);
}

// The keys file's entry for `name`, as the agent's own subcommand prints it.
function entry(name) {
  const out = execFileSync(path.join(binDir, 'tandem-agent'), ['hash-api-key', '--name', name], {
    input: `${keys[name]}\n`,
  }).toString();
  assert.ok(!out.includes(keys[name]), 'hash-api-key never prints the key');
  assert.match(out, /^- name: "[a-z]+"\n {2}sha256: [0-9a-f]{64}\n$/);
  return out + limits[name];
}

// Replaces the keys file at once, as Kubernetes swaps a Secret's files.
function writeKeys(text) {
  writeFileSync(`${keysFile}.new`, text);
  renameSync(`${keysFile}.new`, keysFile);
}

function client(key, options = {}) {
  return new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: key, maxRetries: 0, ...options });
}

async function metrics() {
  return (await fetch(`${baseURL}/metrics`)).text();
}

// The value of the first series of `name` whose labels contain `label`.
function metricValue(text, name, label) {
  for (const line of text.split('\n')) {
    if (line.startsWith(`${name}{`) && line.includes(label)) return Number(line.split(' ').pop());
  }
  return undefined;
}

async function waitFor(what, condition) {
  const deadline = Date.now() + kEventTimeoutMs;
  while (Date.now() < deadline) {
    if (await condition()) return;
    await sleep(20);
  }
  throw failWithLog(`timed out waiting for ${what}`);
}

const chat = (max_tokens = 4) => ({
  model: kModel,
  messages: [{ role: 'user', content: 'Say something.' }],
  max_tokens,
  temperature: 0,
});

function isAuthenticationError(err) {
  assert.ok(err instanceof OpenAI.AuthenticationError, `AuthenticationError, got ${err}`);
  assert.equal(err.status, 401);
  assert.equal(err.code, 'invalid_api_key');
  assert.equal(err.type, 'invalid_request_error');
  assert.equal(err.param, null);
  return true;
}

function isRateLimitError(code) {
  return (err) => {
    assert.ok(err instanceof OpenAI.RateLimitError, `RateLimitError, got ${err}`);
    assert.equal(err.status, 429);
    assert.equal(err.code, code);
    assert.equal(err.type, 'rate_limit_error');
    const retryAfter = err.headers.get('retry-after');
    assert.match(retryAfter ?? '', /^[0-9]+$/, 'Retry-After in whole seconds');
    assert.ok(Number(retryAfter) >= 1 && Number(retryAfter) <= 2, `Retry-After ${retryAfter}`);
    return true;
  };
}

before(async () => {
  tmp = mkdtempSync(path.join(tmpdir(), 'tandem-node-keys-'));
  const modelDir = path.join(tmp, kModel);
  execFileSync(path.join(binDir, 'tandem-make-model'), ['--out', modelDir], { stdio: 'pipe' });
  keysFile = path.join(tmp, 'api-keys.yaml');
  writeKeys(`keys:\n${Object.keys(keys).map(entry).join('')}`);

  const portFile = path.join(tmp, 'port');
  agent = spawn(
    path.join(binDir, 'tandem-agent'),
    ['--model-dir', modelDir, '--listen', '127.0.0.1:0', '--port-file', portFile, '--log-level', 'warn',
     '--api-keys-file', keysFile, '--api-keys-reload-interval', '200ms', '--sse-keepalive', '200ms',
     '--num-blocks', '1024'],  // room for the long stream of the concurrency test
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  agent.stdout.on('data', (d) => (agentLog += d));
  agent.stderr.on('data', (d) => (agentLog += d));
  exited = new Promise((resolve) => agent.on('exit', (code, signal) => resolve({ code, signal })));
  let running = true;
  exited.then(() => (running = false));

  const deadline = Date.now() + kStartTimeoutMs;
  let ready = false;
  while (Date.now() < deadline && !ready) {
    if (!running) throw failWithLog('tandem-agent exited during start-up');
    if (baseURL === undefined && existsSync(portFile)) {
      baseURL = `http://127.0.0.1:${Number(readFileSync(portFile, 'utf8').split('\n')[0].trim())}`;
    }
    if (baseURL !== undefined) {
      try {
        ready = (await fetch(`${baseURL}/readyz`)).status === 200; // probes need no key
      } catch {
        // not accepting yet
      }
    }
    if (!ready) await sleep(50);
  }
  if (!ready) throw failWithLog(`tandem-agent not ready within ${kStartTimeoutMs} ms`);
});

after(async () => {
  try {
    if (agent && agent.exitCode === null && agent.signalCode === null) {
      agent.kill('SIGTERM');
      let timer;
      const timeout = new Promise((resolve) => (timer = setTimeout(() => resolve('timeout'), kStopTimeoutMs)));
      const result = await Promise.race([exited, timeout]);
      clearTimeout(timer);
      if (result === 'timeout') {
        agent.kill('SIGKILL');
        throw failWithLog(`tandem-agent did not exit within ${kStopTimeoutMs} ms of SIGTERM`);
      }
      assert.deepEqual(result, { code: 0, signal: null }, `tandem-agent's exit after SIGTERM\n${agentLog}`);
    } else if (agent) {
      throw failWithLog(`tandem-agent exited before the end of the tests (code ${agent.exitCode})`);
    }
  } finally {
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  }
});

test('a listed key is served; health, readiness and metrics need no key', async () => {
  const c = client(keys.open);
  assert.deepEqual((await c.models.list()).data.map((m) => m.id), [kModel]);
  const r = await c.chat.completions.create(chat());
  assert.equal(r.object, 'chat.completion');
  const s = await c.completions.create({ model: kModel, prompt: 'x', max_tokens: 3, stream: true });
  let chunks = 0;
  for await (const _ of s) chunks++;
  assert.ok(chunks >= 1);
  for (const p of ['/healthz', '/readyz', '/metrics']) assert.equal((await fetch(`${baseURL}${p}`)).status, 200, p);
});

test('a missing key is an AuthenticationError', async () => {
  // The client always sends its key; a null header removes it.
  const c = client('unused', { defaultHeaders: { Authorization: null } });
  const missing = (err) => isAuthenticationError(err) && /no API key/.test(err.message);
  await assert.rejects(c.models.list(), missing);
  await assert.rejects(c.chat.completions.create(chat()), missing);
  const raw = await fetch(`${baseURL}/v1/models`);
  assert.equal(raw.status, 401);
  assert.equal(raw.headers.get('www-authenticate'), 'Bearer');
});

test('a wrong key is an AuthenticationError, streams included', async () => {
  const c = client('sk-test-wrong-0123456789abcdef');
  await assert.rejects(c.chat.completions.create(chat()),
    (err) => isAuthenticationError(err) && /invalid API key/.test(err.message));
  await assert.rejects(c.completions.create({ model: kModel, prompt: 'x', max_tokens: 3, stream: true }),
    isAuthenticationError);
  // The key itself is never echoed.
  await assert.rejects(c.models.list(), (err) => !JSON.stringify(err.error).includes('sk-test-wrong'));
});

test('over the rate limit: 429 with Retry-After, and the client\'s own retry gets through', async () => {
  await client(keys.slow).models.list(); // takes the bucket's one token
  // The retrying client's first try finds the bucket empty; it waits
  // Retry-After (whole seconds until the next token) and tries again.
  const statuses = [];
  const counting = client(keys.slow, {
    maxRetries: 3,
    fetch: async (url, init) => {
      const r = await fetch(url, init);
      statuses.push(r.status);
      return r;
    },
  });
  const r = await counting.chat.completions.create(chat());
  assert.equal(r.object, 'chat.completion');
  assert.equal(statuses[0], 429, `statuses ${statuses}`);
  assert.equal(statuses.at(-1), 200, `statuses ${statuses}`);
  // That success took the token again: without retries the client sees the 429.
  await assert.rejects(client(keys.slow).chat.completions.create(chat()), isRateLimitError('rate_limit_exceeded'));
});

test('over the concurrency limit: 429 while a stream is open, free again when it ends', async () => {
  const c = client(keys.single);
  // A long stream holds the key's one slot (a few seconds of tokens even on a fast machine).
  const stream = await c.completions.create({
    model: kModel, prompt: 'a long answer', max_tokens: 15000, ignore_eos: true, stream: true,
  });
  const it = stream[Symbol.asyncIterator]();
  assert.equal((await it.next()).done, false, 'the stream has begun');
  await assert.rejects(c.chat.completions.create(chat()), isRateLimitError('concurrency_limit_exceeded'));
  await assert.rejects(c.completions.create({ model: kModel, prompt: 'x', max_tokens: 2, stream: true }),
    isRateLimitError('concurrency_limit_exceeded'));
  // The client hangs up: the agent notices at its next write, cancels the
  // request and frees the slot; the retrying client gets in then.
  stream.controller.abort();
  const r = await client(keys.single, { maxRetries: 20 }).chat.completions.create(chat());
  assert.equal(r.object, 'chat.completion');
  // A finished request frees its slot before its answer is sent: the next
  // one, at once and without retries, is served. Also after an error.
  await client(keys.single).chat.completions.create(chat());
  for await (const _ of await c.completions.create({ model: kModel, prompt: 'x', max_tokens: 3, stream: true })) {
    // drain
  }
  await assert.rejects(c.chat.completions.create({ ...chat(), model: 'no-such-model' }),
    (err) => err instanceof OpenAI.NotFoundError);
  await client(keys.single).chat.completions.create(chat());
});

test('a key removed from the file is refused from the next reload; a bad file changes nothing', async () => {
  const c = client(keys.revoked);
  await c.models.list();
  writeKeys(`keys:\n${['open', 'slow', 'single'].map(entry).join('')}`);
  await waitFor('the revocation', async () => {
    try {
      await c.models.list();
      return false;
    } catch (err) {
      return isAuthenticationError(err);
    }
  });
  await assert.rejects(c.chat.completions.create(chat()), isAuthenticationError);

  // A file that does not parse: counted, logged, and the keys in force stay.
  const before = metricValue(await metrics(), 'tandem_api_keys_reload_failures_total', 'pool=');
  writeKeys('keys:\n- name: broken\n  sha256: not-a-hash\n');
  await waitFor('the bad file to be noticed', async () =>
    metricValue(await metrics(), 'tandem_api_keys_reload_failures_total', 'pool=') > before);
  await client(keys.open).models.list();
  await assert.rejects(c.models.list(), isAuthenticationError);
  assert.match(agentLog, /keys\[0\]\.sha256: expected the key's SHA-256 as 64 hex digits/);

  const m = await metrics();
  assert.ok(metricValue(m, 'tandem_api_requests_rejected_total', 'reason="invalid_api_key"') >= 5, m);
  assert.ok(metricValue(m, 'tandem_api_requests_rejected_total', 'reason="rate_limited"') >= 2, m);
  assert.ok(metricValue(m, 'tandem_api_requests_rejected_total', 'reason="concurrency_limited"') >= 2, m);
  assert.equal(metricValue(m, 'tandem_api_keys', 'pool='), 3, m);
  for (const key of Object.values(keys)) assert.ok(!m.includes(key), 'no key in the metrics');
});
