// tandem-agent's OpenAI-compatible API driven by the official `openai` npm
// client (the version pinned in package.json), so what real applications
// send and parse is what we test: request shapes, SSE framing of streams,
// usage chunks and error bodies.
//
// Starts one tandem-agent with the built-in tiny model (agent_harness.mjs),
// runs the cases sequentially (temperature 0 output is then
// deterministic: one request at a time, same batch shape), and stops the
// agent with SIGTERM, which must exit 0. Run by hand:
//   TANDEM_BIN_DIR=build/bin node --test tests/agent/node/openai_client_test.mjs

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { kModel, OpenAI, startAgent } from './agent_harness.mjs';

let agent; // startAgent's result
let client;

before(async () => {
  agent = await startAgent();
  client = agent.client;
});

after(async () => {
  if (agent) await agent.stop();
});

// usage must add up and respect max_tokens.
function checkUsage(usage, maxTokens) {
  assert.ok(usage, 'usage is present');
  assert.ok(usage.prompt_tokens > 0, `prompt_tokens ${usage.prompt_tokens} > 0`);
  assert.ok(usage.completion_tokens >= 1, `completion_tokens ${usage.completion_tokens} >= 1`);
  assert.ok(usage.completion_tokens <= maxTokens, `completion_tokens ${usage.completion_tokens} <= max_tokens ${maxTokens}`);
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens, 'total = prompt + completion');
}

const chatRequest = {
  model: kModel,
  messages: [
    { role: 'system', content: 'You are terse.' },
    { role: 'user', content: 'Say something about the sea.' },
  ],
  max_tokens: 24,
  temperature: 0,
};

// Collects a stream: the concatenated text, the finish reasons seen and the usage chunk.
async function collect(stream, textOf) {
  let text = '';
  const finishReasons = [];
  let usage = null;
  let numChunks = 0;
  for await (const chunk of stream) {
    numChunks++;
    if (chunk.usage) {
      assert.equal(usage, null, 'one usage chunk');
      assert.deepEqual(chunk.choices, [], 'the usage chunk has no choices');
      usage = chunk.usage;
      continue;
    }
    assert.equal(chunk.choices.length, 1);
    text += textOf(chunk.choices[0]) ?? '';
    if (chunk.choices[0].finish_reason) finishReasons.push(chunk.choices[0].finish_reason);
  }
  return { text, finishReasons, usage, numChunks };
}

test('models.list returns the one served model', async () => {
  const page = await client.models.list();
  assert.deepEqual(
    page.data.map((m) => m.id),
    [kModel],
  );
  assert.equal(page.data[0].object, 'model');
});

test('chat.completions.create (non-streaming)', async () => {
  const r = await client.chat.completions.create(chatRequest);
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.model, kModel);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason), `finish_reason ${r.choices[0].finish_reason}`);
  checkUsage(r.usage, chatRequest.max_tokens);
  if (r.choices[0].finish_reason === 'length') assert.equal(r.usage.completion_tokens, chatRequest.max_tokens);
});

test('chat with ignore_eos runs to max_tokens and finishes "length"', async () => {
  const r = await client.chat.completions.create({ ...chatRequest, max_tokens: 10, ignore_eos: true });
  assert.equal(r.choices[0].finish_reason, 'length');
  checkUsage(r.usage, 10);
  assert.equal(r.usage.completion_tokens, 10);
});

test('completions.create (non-streaming)', async () => {
  const r = await client.completions.create({ model: kModel, prompt: 'Once upon a time', max_tokens: 16, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.model, kModel);
  assert.equal(r.choices.length, 1);
  assert.equal(typeof r.choices[0].text, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason), `finish_reason ${r.choices[0].finish_reason}`);
  checkUsage(r.usage, 16);

  const long = await client.completions.create({
    model: kModel, prompt: 'Once upon a time', max_tokens: 12, temperature: 0, ignore_eos: true,
  });
  assert.equal(long.choices[0].finish_reason, 'length');
  assert.equal(long.usage.completion_tokens, 12);
  assert.equal(long.usage.prompt_tokens, r.usage.prompt_tokens, 'same prompt, same prompt_tokens');
});

test('streaming chat equals non-streaming at temperature 0, with a usage chunk', async () => {
  for (const extra of [{}, { ignore_eos: true }]) {
    const whole = await client.chat.completions.create({ ...chatRequest, ...extra });
    const stream = await client.chat.completions.create({
      ...chatRequest, ...extra, stream: true, stream_options: { include_usage: true },
    });
    const got = await collect(stream, (c) => c.delta?.content);
    assert.equal(got.text, whole.choices[0].message.content, `streamed text (${JSON.stringify(extra)})`);
    assert.deepEqual(got.finishReasons, [whole.choices[0].finish_reason]);
    assert.deepEqual(got.usage, whole.usage);
    checkUsage(got.usage, chatRequest.max_tokens);
    assert.ok(got.numChunks >= 3, 'role chunk, content, finish and usage chunks');
  }
});

test('streaming completions equals non-streaming at temperature 0', async () => {
  const req = { model: kModel, prompt: 'The quick brown fox', max_tokens: 20, temperature: 0, ignore_eos: true };
  const whole = await client.completions.create(req);
  const stream = await client.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  const got = await collect(stream, (c) => c.text);
  assert.equal(got.text, whole.choices[0].text);
  assert.deepEqual(got.finishReasons, ['length']);
  assert.deepEqual(got.usage, whole.usage);
});

test('a seed makes sampling at temperature 1 repeatable', async () => {
  const req = { ...chatRequest, temperature: 1, seed: 7, max_tokens: 24, ignore_eos: true };
  const a = await client.chat.completions.create(req);
  const b = await client.chat.completions.create(req);
  assert.equal(a.choices[0].message.content.length > 0, true);
  assert.equal(b.choices[0].message.content, a.choices[0].message.content);
  // Streaming draws the same samples.
  const s = await collect(await client.chat.completions.create({ ...req, stream: true }), (c) => c.delta?.content);
  assert.equal(s.text, a.choices[0].message.content);
  // Another seed gives other text (deterministic too: fixed weights, seeded sampling).
  const c = await client.chat.completions.create({ ...req, seed: 8 });
  assert.notEqual(c.choices[0].message.content, a.choices[0].message.content);
});

test('an unknown model is a 404 APIError', async () => {
  await assert.rejects(
    client.chat.completions.create({ ...chatRequest, model: 'no-such-model' }),
    (err) => {
      assert.ok(err instanceof OpenAI.APIError, `APIError, got ${err}`);
      assert.ok(err instanceof OpenAI.NotFoundError);
      assert.equal(err.status, 404);
      assert.equal(err.code, 'model_not_found');
      return true;
    },
  );
  // A stream fails the same way, before any chunk.
  await assert.rejects(
    client.completions.create({ model: 'no-such-model', prompt: 'x', max_tokens: 4, stream: true }),
    (err) => err instanceof OpenAI.APIError && err.status === 404,
  );
});

test('n: 2 is a 400 APIError naming the field', async () => {
  await assert.rejects(client.chat.completions.create({ ...chatRequest, n: 2 }), (err) => {
    assert.ok(err instanceof OpenAI.BadRequestError, `BadRequestError, got ${err}`);
    assert.equal(err.status, 400);
    assert.equal(err.param, 'n');
    assert.match(err.message, /'n' must be 1/);
    return true;
  });
});
