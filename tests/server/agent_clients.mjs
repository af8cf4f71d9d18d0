// Official SDKs (pinned in tests/oracle/package.json) against a running `lily serve --demo`: OpenAI's
// `responses.create` / `responses.stream`, Anthropic's `messages.create` / `messages.stream` / `countTokens`, and
// the Vercel AI SDK's default `openai(id)` provider (which speaks the Responses API). The demo model emits noise,
// so the output's kind is forced with the lily extension field `logit_bias` (ids looked up with /tokenize):
// thinking on with `</think>` banned → all reasoning; thinking off with the tag ids banned → all text. Tool calls
// are covered by round-tripping tool histories (the generated-call mapping is unit-tested in
// test_server_apis.cpp). Usage: node agent_clients.mjs BASE_URL API_KEY. Exit 0 = pass.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const modules = path.join(here, '../oracle/node_modules');
const require = createRequire(path.join(here, '../oracle/package.json'));
const OpenAI = require('openai').default ?? require('openai');
const Anthropic = require('@anthropic-ai/sdk').default ?? require('@anthropic-ai/sdk');
const ai = await import(pathToFileURL(path.join(modules, 'ai/dist/index.js')));
const aiOpenai = await import(pathToFileURL(path.join(modules, '@ai-sdk/openai/dist/index.js')));

const base = process.argv[2];
const apiKey = process.argv[3];
const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0, timeout: 60_000 });
const anthropic = new Anthropic({ baseURL: base, apiKey, maxRetries: 0, timeout: 60_000 });

const model = (await openai.models.list()).data[0].id;
async function tokenId(text) {
  const r = await fetch(`${base}/tokenize`, { method: 'POST', headers: { authorization: `Bearer ${apiKey}`,
    'content-type': 'application/json' }, body: JSON.stringify({ content: text }) });
  const j = await r.json();
  assert.equal(j.tokens.length, 1, `${text} is one token`);
  return j.tokens[0];
}
const ban = {};
for (const t of ['<|endoftext|>', '<|im_end|>', '<|im_start|>']) ban[await tokenId(t)] = -100;
const toolOpen = await tokenId('<tool_call>');
const thinkOpen = await tokenId('<think>');
const thinkClose = await tokenId('</think>');
const allReasoning = { ...ban, [thinkClose]: -100, [toolOpen]: -100 };
const allText = { ...ban, [thinkOpen]: -100, [thinkClose]: -100, [toolOpen]: -100 };

// ---------------- OpenAI Responses ----------------
{
  // reasoning only (thinking on, </think> banned), cut by max_output_tokens
  const r = await openai.responses.create({ model, input: 'Hello', max_output_tokens: 8, reasoning: { effort: 'high' },
    temperature: 0.8, logit_bias: allReasoning, seed: 3 });
  assert.equal(r.object, 'response');
  assert.equal(r.status, 'incomplete');
  assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  assert.ok(r.id.startsWith('resp_'));
  assert.equal(r.output[0].type, 'reasoning');
  assert.ok(r.output[0].summary[0].text.length > 0);
  assert.equal(r.output_text, '');
  assert.equal(r.usage.output_tokens, 8);
  assert.equal(r.usage.output_tokens_details.reasoning_tokens, 8);
  assert.equal(typeof r.usage.input_tokens_details.cached_tokens, 'number');
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);

  // text only (reasoning effort none = thinking off); the stream rebuilds the same response for one seed
  const params = { model, instructions: 'Be brief.', input: [{ role: 'user', content: 'Hi' }], max_output_tokens: 10,
    reasoning: { effort: 'none' }, temperature: 0.9, top_p: 0.95, logit_bias: allText, seed: 7 };
  const t = await openai.responses.create(params);
  assert.equal(t.output.length, 1);
  assert.equal(t.output[0].type, 'message');
  assert.equal(t.output[0].role, 'assistant');
  assert.equal(t.output[0].content[0].type, 'output_text');
  assert.ok(t.output_text.length > 0);
  assert.equal(t.instructions, 'Be brief.');
  assert.equal(t.usage.output_tokens_details.reasoning_tokens, 0);

  const stream = openai.responses.stream(params);
  const names = [];
  let seq = 0, delta = '', last = null;
  for await (const ev of stream) {
    names.push(ev.type);
    assert.equal(ev.sequence_number, seq++, `sequence_number of ${ev.type}`);
    if (ev.type === 'response.output_text.delta') delta += ev.delta;
    if (ev.type === 'response.incomplete') last = ev.response;
  }
  const fin = await stream.finalResponse();
  assert.equal(delta, t.output_text);
  // (this SDK version takes the final snapshot only from response.completed; for an incomplete one it keeps its own)
  assert.equal(fin.output[0].content[0].text, t.output_text);
  assert.equal(last.status, 'incomplete');
  assert.equal(last.usage.input_tokens, t.usage.input_tokens);
  assert.equal(last.usage.output_tokens, t.usage.output_tokens);
  assert.ok(last.usage.input_tokens_details.cached_tokens > 0, 'the same prompt again hits the prefix cache');
  assert.equal(last.output[0].content[0].text, t.output_text);
  const order = ['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added',
    'response.output_text.delta', 'response.output_text.done', 'response.content_part.done', 'response.output_item.done',
    'response.incomplete'];
  assert.deepEqual(names.filter((n, i) => n !== 'response.output_text.delta' || names[i - 1] !== n), order);

  // reasoning streams as summary text deltas
  const rs = openai.responses.stream({ model, input: 'Hello', max_output_tokens: 6, logit_bias: allReasoning, seed: 3 });
  let summary = '', rf = null;
  for await (const ev of rs) {
    if (ev.type === 'response.reasoning_summary_text.delta') summary += ev.delta;
    if (ev.type === 'response.incomplete') rf = ev.response;
  }
  assert.ok(summary.length > 0);
  assert.equal(rf.output[0].summary[0].text, summary);

  // a tool-calling history: function_call and function_call_output items render into the prompt
  const tools = [{ type: 'function', name: 'get_weather', description: 'Weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
  const h = await openai.responses.create({ model, tools, max_output_tokens: 3, input: [
    { role: 'user', content: 'Weather in Rome?' },
    { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Roma"}' },
    { type: 'function_call_output', call_id: 'call_1', output: 'sunny, 24 C' }] });
  const plain = await openai.responses.create({ model, max_output_tokens: 3, input: 'Weather in Rome?' });
  assert.ok(h.usage.input_tokens > plain.usage.input_tokens + 40, 'tools and history rendered');
  assert.deepEqual(h.tools.map((x) => x.name), ['get_weather']);

  // errors
  async function expectError(params, param) {
    try {
      await openai.responses.create({ model, max_output_tokens: 2, input: 'x', ...params });
    } catch (e) {
      assert.ok(e instanceof OpenAI.BadRequestError, `BadRequestError, got ${e}`);
      assert.equal(e.param, param, e.message);
      return;
    }
    assert.fail(`no error for ${JSON.stringify(params)}`);
  }
  await expectError({ previous_response_id: 'resp_123' }, 'previous_response_id');
  await expectError({ store: true }, 'store');
  await expectError({ max_output_tokens: 0 }, 'max_output_tokens');
  await expectError({ tools: [{ type: 'web_search' }] }, 'tools[0].type');
  await expectError({ input: [{ type: 'function_call', name: 'f', arguments: '{}' }] }, 'input[0].call_id');
}

// ---------------- Anthropic Messages ----------------
{
  const user = [{ role: 'user', content: 'Hello' }];
  const m = await anthropic.messages.create({ model, max_tokens: 8, messages: user, logit_bias: allText, seed: 5 });
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.ok(m.id.startsWith('msg_'));
  assert.equal(m.content.length, 1);
  assert.equal(m.content[0].type, 'text');
  assert.equal(m.stop_reason, 'max_tokens');
  assert.equal(m.usage.output_tokens, 8);
  assert.equal(typeof m.usage.cache_read_input_tokens, 'number');

  // thinking enabled: a thinking block with a signature
  const th = await anthropic.messages.create({ model, max_tokens: 6, messages: user, logit_bias: allReasoning, seed: 5,
    thinking: { type: 'enabled', budget_tokens: 1024 } });
  assert.equal(th.content[0].type, 'thinking');
  assert.ok(th.content[0].thinking.length > 0);
  assert.ok(th.content[0].signature.length > 0);

  // the stream rebuilds the same message for one seed; its events come in the documented order
  const params = { model, max_tokens: 10, system: [{ type: 'text', text: 'Be brief.' }], messages: user,
    temperature: 0.9, top_k: 40, logit_bias: allText, seed: 9 };
  const once = await anthropic.messages.create(params);
  const stream = anthropic.messages.stream(params);
  const names = [];
  let text = '';
  stream.on('text', (d) => { text += d; });
  for await (const ev of stream) names.push(ev.type);
  const fin = await stream.finalMessage();
  assert.equal(text, once.content[0].text);
  assert.deepEqual(fin.content, once.content);
  assert.equal(fin.stop_reason, once.stop_reason);
  assert.equal(fin.usage.output_tokens, once.usage.output_tokens);
  assert.deepEqual(names.filter((n, i) => n !== 'content_block_delta' || names[i - 1] !== n),
    ['message_start', 'content_block_start', 'content_block_delta', 'content_block_stop', 'message_delta', 'message_stop']);

  // thinking streams as thinking_delta + signature_delta
  const ts = anthropic.messages.stream({ model, max_tokens: 6, messages: user, logit_bias: allReasoning,
    thinking: { type: 'enabled', budget_tokens: 1024 } });
  const tf = await ts.finalMessage();
  assert.equal(tf.content[0].type, 'thinking');
  assert.ok(tf.content[0].thinking.length > 0 && tf.content[0].signature.length > 0);

  // stop_sequences: a stop string made of the text the seed produces
  const cut = once.content[0].text.slice(2, 5);
  if (cut.length === 3 && once.content[0].text.indexOf(cut) === 2) {
    const s = await anthropic.messages.create({ ...params, stop_sequences: [cut] });
    assert.equal(s.stop_reason, 'stop_sequence');
    assert.equal(s.stop_sequence, cut);
    assert.equal(s.content[0].text, once.content[0].text.slice(0, 2));
  }

  // a tool history (tool_use / tool_result blocks) renders; count_tokens counts the same prompt
  const tools = [{ name: 'get_weather', description: 'Weather for a city',
    input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
  const hist = [{ role: 'user', content: 'Weather in Rome?' },
    { role: 'assistant', content: [{ type: 'text', text: 'Checking.' },
      { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Roma' } }] },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: 'sunny, 24 C' }] }];
  const h = await anthropic.messages.create({ model, max_tokens: 3, tools, messages: hist });
  const n = await anthropic.messages.countTokens({ model, tools, messages: hist });
  assert.equal(n.input_tokens, h.usage.input_tokens + h.usage.cache_read_input_tokens);
  const none = await anthropic.messages.countTokens({ model, tools, messages: hist, tool_choice: { type: 'none' } });
  assert.ok(none.input_tokens < n.input_tokens - 40, 'tool_choice none renders no tools');

  // Anthropic-shaped errors
  async function expectError(params, status) {
    try {
      await anthropic.messages.create({ model, messages: user, ...params });
    } catch (e) {
      assert.ok(e instanceof Anthropic.APIError, `APIError, got ${e}`);
      assert.equal(e.status, status, e.message);
      assert.equal(e.error.type, 'error');
      assert.equal(e.error.error.type, 'invalid_request_error');
      assert.ok(e.error.error.message.length > 0);
      return;
    }
    assert.fail(`no error for ${JSON.stringify(params)}`);
  }
  await expectError({}, 400);  // max_tokens missing
  await expectError({ max_tokens: 4, temperature: 1.5 }, 400);
  await expectError({ max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'image',
    source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }] }, 400);
}

// ---------------- Vercel AI SDK, default openai(id) provider (Responses API) ----------------
{
  const provider = aiOpenai.createOpenAI({ baseURL: `${base}/v1`, apiKey });
  const g = await ai.generateText({ model: provider(model), prompt: 'Hello', maxOutputTokens: 6, maxRetries: 0 });
  assert.equal(typeof g.text, 'string');
  assert.ok(g.usage.inputTokens > 0);
  assert.ok(g.usage.outputTokens > 0 && g.usage.outputTokens <= 6);
  assert.ok(['length', 'stop'].includes(g.finishReason), g.finishReason);
  const s = ai.streamText({ model: provider(model), prompt: 'Hello', maxOutputTokens: 6, maxRetries: 0 });
  let parts = 0;
  for await (const p of s.fullStream) {
    if (p.type === 'error') throw p.error;
    parts++;
  }
  assert.ok(parts > 2);
  assert.ok((await s.usage).outputTokens > 0);
  assert.ok(['length', 'stop'].includes(await s.finishReason));
}
// ---------------- forced tool calls and json_schema output ----------------
// Both map onto the chat path's tool_choice required / named and response_format json_schema, so these APIs must
// answer as the chat endpoint does: 400 where the chat path has no constrained decoding, else a real tool call
// (streamed as function_call / tool_use events) and schema-valid JSON.
{
  const fnTools = [{ type: 'function', function: { name: 'get_weather',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const chat = await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { authorization: `Bearer ${apiKey}`,
    'content-type': 'application/json' }, body: JSON.stringify({ model, max_tokens: 40, tools: fnTools,
    tool_choice: 'required', messages: [{ role: 'user', content: 'w?' }], seed: 1 }) });
  const forced = chat.status === 200;
  if (!forced) assert.equal(chat.status, 400);
  const rTools = [{ type: 'function', name: 'get_weather',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
  const aTools = [{ name: 'get_weather', input_schema: rTools[0].parameters }];
  const schema = { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'], additionalProperties: false };
  if (forced) {
    const rs = openai.responses.stream({ model, input: 'w?', tools: rTools, tool_choice: 'required',
      max_output_tokens: 40, reasoning: { effort: 'none' }, seed: 1 });
    let args = '', added = null, end = null;
    for await (const ev of rs) {
      if (ev.type === 'response.output_item.added' && ev.item.type === 'function_call') added = ev.item;
      if (ev.type === 'response.function_call_arguments.delta') args += ev.delta;
      if (ev.type === 'response.completed' || ev.type === 'response.incomplete') end = ev.response;
    }
    assert.equal(added.name, 'get_weather');
    const call = end.output.find((o) => o.type === 'function_call');
    assert.equal(call.arguments, args);
    assert.equal(typeof JSON.parse(args).city, 'string');
    const m = await anthropic.messages.create({ model, max_tokens: 40, tools: aTools, seed: 1,
      tool_choice: { type: 'tool', name: 'get_weather' }, messages: [{ role: 'user', content: 'w?' }] });
    assert.equal(m.content[0].type, 'tool_use');
    assert.equal(m.content[0].name, 'get_weather');
    assert.equal(typeof m.content[0].input.city, 'string');
    assert.ok(['tool_use', 'max_tokens'].includes(m.stop_reason));
    const j = await openai.responses.create({ model, input: 'x', max_output_tokens: 300, reasoning: { effort: 'none' },
      seed: 1, text: { format: { type: 'json_schema', name: 'o', schema, strict: true } } });
    assert.equal(j.status, 'completed');
    assert.ok(Number.isInteger(JSON.parse(j.output_text).a), j.output_text);
  } else {
    await assert.rejects(openai.responses.create({ model, input: 'w?', tools: rTools, tool_choice: 'required',
      max_output_tokens: 4 }), (e) => e.status === 400 && e.param === 'tool_choice');
    await assert.rejects(anthropic.messages.create({ model, max_tokens: 4, tools: aTools, tool_choice: { type: 'any' },
      messages: [{ role: 'user', content: 'w?' }] }), (e) => e.status === 400 && e.error.error.type === 'invalid_request_error');
    await assert.rejects(openai.responses.create({ model, input: 'x', max_output_tokens: 4,
      text: { format: { type: 'json_schema', name: 'o', schema } } }), (e) => e.status === 400 && e.param === 'text.format');
  }
  console.log(`forced tool calls and json_schema: ${forced ? 'generated' : 'not supported by the chat path (400)'}`);
}

// ---------------- /metrics: the request counter by endpoint ----------------
{
  await openai.chat.completions.create({ model, max_tokens: 2, messages: [{ role: 'user', content: 'x' }] });
  const text = await (await fetch(`${base}/metrics`)).text();
  for (const series of ['lily_requests_total{endpoint="responses",status="200"}',
    'lily_requests_total{endpoint="messages",status="200"}', 'lily_requests_total{endpoint="chat",status="200"}',
    'lily_tool_call_parse_failures_total 0\n'])
    assert.ok(text.includes(series), `${series} in /metrics`);
}
console.log('agent clients: all checks passed');
