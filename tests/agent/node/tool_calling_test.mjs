// Tool calling through the official `openai` npm client: a chat with
// `tools` streams `tool_calls` (accumulated by the client's stream helper)
// and finishes "tool_calls"; the conversation then goes on with the
// assistant's call and a `tool` message, and the assistant answers in text.
//
// The agent serves the tiny model with a Hermes-style chat template
// written into its tokenizer_config.json, and its replies come from the
// --scripted-output test hook (with --allow-test-hooks true): request 1
// replies with a <tool_call> block, request 2 with text. The tests run in
// order, one request each. The agent is started by agent_harness.mjs.
// Run by hand:
//   TANDEM_BIN_DIR=build/bin node --test tests/agent/node/tool_calling_test.mjs

import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { kModel, startAgent } from './agent_harness.mjs';

// Tools as <tools>name;...</tools>, then [role:content<tool_call>name(arguments)</tool_call>] per message.
const kTemplate =
  '{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>{% endif %}' +
  '{% for m in messages %}[{{ m.role }}:{{ m.content }}' +
  '{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }}({{ c.function.arguments | tojson }})' +
  '</tool_call>{% endfor %}{% endif %}]{% endfor %}';

// What the model "says" to requests 1 and 2 (--scripted-output).
const kAnswer = 'It is 21 degrees and sunny in Paris.';
const kReplies = [
  'Let me look that up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
  kAnswer,
];

let agent; // startAgent's result
let client;

before(async () => {
  agent = await startAgent({
    prepare: (tmp, modelDir) => {
      const configPath = path.join(modelDir, 'tokenizer_config.json');
      const config = JSON.parse(readFileSync(configPath, 'utf8'));
      config.chat_template = kTemplate;
      writeFileSync(configPath, JSON.stringify(config));
      const scriptPath = path.join(tmp, 'replies.txt');
      writeFileSync(scriptPath, kReplies.join('\n<|next_reply|>\n'));
      return ['--allow-test-hooks', 'true', '--scripted-output', scriptPath];
    },
  });
  client = agent.client;
});

after(async () => {
  if (agent) await agent.stop();
});

const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'The current weather in a city.',
      parameters: {
        type: 'object',
        properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
        required: ['city'],
      },
    },
  },
];
const question = { role: 'user', content: 'What is the weather in Paris?' };
let assistantTurn;  // the first test's reply, which the second continues from

test('a chat with tools streams tool_calls and finishes "tool_calls"', async () => {
  const stream = client.chat.completions.stream({
    model: kModel,
    messages: [question],
    tools,
    stream_options: { include_usage: true },
  });
  const argumentsDone = [];
  stream.on('tool_calls.function.arguments.done', (e) => argumentsDone.push(e));
  let content = '';
  for await (const chunk of stream) {
    for (const c of chunk.choices) content += c.delta?.content ?? '';
  }
  const completion = await stream.finalChatCompletion();
  const choice = completion.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(content, 'Let me look that up.', 'the text before the call streams as content');
  assert.equal(choice.message.content, 'Let me look that up.');
  assert.equal(choice.message.tool_calls.length, 1, JSON.stringify(choice.message));
  const call = choice.message.tool_calls[0];
  assert.match(call.id, /^call_/);
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris', unit: 'celsius' });
  assert.equal(argumentsDone.length, 1, 'the helper saw the call\'s arguments complete');
  assert.equal(argumentsDone[0].name, 'get_weather');
  assert.ok(completion.usage && completion.usage.completion_tokens > 0, 'usage chunk');
  assistantTurn = choice.message;
});

test('the conversation goes on with a tool message and the assistant answers in text', async () => {
  assert.ok(assistantTurn, 'the previous test produced the tool call');
  const call = assistantTurn.tool_calls[0];
  const result = await client.chat.completions.create({
    model: kModel,
    messages: [
      question,
      { role: 'assistant', content: assistantTurn.content, tool_calls: assistantTurn.tool_calls },
      { role: 'tool', tool_call_id: call.id, content: '{"temperature": 21, "sky": "sunny"}' },
    ],
    tools,
  });
  const choice = result.choices[0];
  assert.equal(choice.finish_reason, 'stop');
  assert.equal(choice.message.content, kAnswer);
  assert.equal(choice.message.tool_calls, undefined);
  // The template saw the whole history: the tools, the question, the call
  // (its arguments as an object) and the result; one token per character.
  const rendered =
    '<tools>get_weather;</tools>[user:What is the weather in Paris?]' +
    '[assistant:Let me look that up.<tool_call>get_weather({"city": "Paris", "unit": "celsius"})</tool_call>]' +
    '[tool:{"temperature": 21, "sky": "sunny"}]';
  assert.equal(result.usage.prompt_tokens, rendered.length);
});

test('a bad tool is a 400 APIError naming the field', async () => {
  await assert.rejects(
    client.chat.completions.create({
      model: kModel,
      messages: [question],
      tools: [...tools, { type: 'function', function: { description: 'no name' } }],
    }),
    (e) => {
      assert.equal(e.status, 400);
      assert.equal(e.param, 'tools[1].function.name');
      assert.match(e.message, /tools\[1\]\.function\.name: required/);
      return true;
    },
  );
});
