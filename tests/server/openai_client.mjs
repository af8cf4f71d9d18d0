// The official `openai` npm client (v6, pinned in tests/oracle/package.json) against a running `lily serve`:
// model list, non-streaming and streaming chat with usage, stream == non-stream for one seed, a tool-calling
// history, n = 2 choices (non-streaming and streaming), /v1/completions, and typed errors with `param`.
// Usage: node openai_client.mjs BASE_URL. Exit 0 = pass.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, '../oracle/package.json'));
const OpenAI = require('openai').default ?? require('openai');

const baseURL = process.argv[2];
const client = new OpenAI({ baseURL, apiKey: 'any', maxRetries: 0, timeout: 60_000 });
const user = (content) => [{ role: 'user', content }];

const models = await client.models.list();
const model = models.data[0].id;
assert.ok(models.data[0].max_model_len > 0, 'max_model_len exposed');

// non-streaming
const a = await client.chat.completions.create({ model, messages: user('Hello'), max_tokens: 10, seed: 5, temperature: 0.9 });
assert.equal(a.object, 'chat.completion');
assert.equal(a.choices.length, 1);
assert.ok(['stop', 'length'].includes(a.choices[0].finish_reason));
assert.equal(a.usage.total_tokens, a.usage.prompt_tokens + a.usage.completion_tokens);
assert.equal(typeof a.usage.prompt_tokens_details.cached_tokens, 'number');
assert.equal(typeof a.usage.completion_tokens_details.reasoning_tokens, 'number');

// streaming with usage: same seed, same text
const stream = await client.chat.completions.create({
  model, messages: user('Hello'), max_tokens: 10, seed: 5, temperature: 0.9, stream: true,
  stream_options: { include_usage: true },
});
let reasoning = '', content = '', finish = null, usage = null, first = true;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  if (!chunk.choices.length) continue;
  const c = chunk.choices[0];
  if (first) { assert.equal(c.delta.role, 'assistant'); first = false; }
  reasoning += c.delta.reasoning_content ?? '';
  content += c.delta.content ?? '';
  if (c.finish_reason) finish = c.finish_reason;
}
assert.ok(usage, 'usage chunk received');
assert.equal(usage.completion_tokens, a.usage.completion_tokens);
assert.equal(finish, a.choices[0].finish_reason);
assert.equal(reasoning, a.choices[0].message.reasoning_content ?? '');
assert.equal(content, a.choices[0].message.content ?? '');

// a tool-calling history (arguments as a JSON string, tool results) renders and runs
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather for a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
const t = await client.chat.completions.create({
  model, tools, max_tokens: 4, messages: [
    { role: 'developer', content: 'Use tools.' },
    { role: 'user', content: 'Weather in Rome?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
      function: { name: 'get_weather', arguments: '{"city": "Roma"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: 'sunny, 24 C' },
  ] });
assert.ok(['stop', 'length', 'tool_calls'].includes(t.choices[0].finish_reason));
assert.ok(t.usage.prompt_tokens > 40, 'tools and history were rendered into the prompt');

// n = 2: one choice per index, streamed chunks interleaved by index rebuild the same texts
const two = await client.chat.completions.create({ model, messages: user('Hi'), max_tokens: 8, seed: 9, temperature: 1, n: 2 });
assert.deepEqual(two.choices.map((ch) => ch.index), [0, 1]);
const twoStream = await client.chat.completions.create({
  model, messages: user('Hi'), max_tokens: 8, seed: 9, temperature: 1, n: 2, stream: true,
  stream_options: { include_usage: true },
});
const texts = ['', ''], finishes = [null, null];
let twoUsage = null;
for await (const chunk of twoStream) {
  if (chunk.usage) twoUsage = chunk.usage;
  for (const ch of chunk.choices) {
    texts[ch.index] += (ch.delta.reasoning_content ?? '') + (ch.delta.content ?? '');
    if (ch.finish_reason) finishes[ch.index] = ch.finish_reason;
  }
}
for (const i of [0, 1]) {
  const m = two.choices[i].message;
  assert.equal(texts[i], (m.reasoning_content ?? '') + (m.content ?? ''), `choice ${i} text`);
  assert.equal(finishes[i], two.choices[i].finish_reason, `choice ${i} finish_reason`);
}
assert.equal(twoUsage.completion_tokens, two.usage.completion_tokens);

// raw completions
const c = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 5, seed: 1 });
assert.equal(c.object, 'text_completion');
assert.equal(typeof c.choices[0].text, 'string');

// typed errors
async function expectError(params, status, param) {
  try {
    await client.chat.completions.create({ model, max_tokens: 2, ...params });
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIError, `APIError, got ${e}`);
    assert.equal(e.status, status, e.message);
    if (param !== undefined) assert.equal(e.param, param, e.message);
    return;
  }
  assert.fail(`no error for ${JSON.stringify(params)}`);
}
await expectError({ messages: user('x'), temperature: 'hot' }, 400, 'temperature');
await expectError({ messages: user('x'), n: 17 }, 400, 'n');
await expectError({ messages: [{ role: 'wizard', content: 'x' }] }, 400, 'messages[0].role');
await expectError({ messages: user('x'), tools: [{ type: 'function', function: { name: 'f', parameters: 'nope' } }] },
  400, 'tools[0].function.parameters');
try {
  await client.chat.completions.create({ model, messages: user('x'), temperature: 5 });
  assert.fail('no error');
} catch (e) {
  assert.ok(e instanceof OpenAI.BadRequestError);
}
console.log('openai client: all checks passed');
