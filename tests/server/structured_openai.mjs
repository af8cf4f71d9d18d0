// Structured output through the official `openai` npm client against `lily serve --demo` (noise model):
// forced tool calls (tool_choice "required" and a named function, parallel_tool_calls false/true) whose
// arguments must parse and validate (ajv) against the tool's parameters; chat.completions.parse with
// zodResponseFormat, json_schema and zodFunction; grammar/regex/json_object/text; the 400s (BadRequestError
// naming keyword and schema path), stream == non-stream. Usage: node structured_openai.mjs BASE_URL. Exit 0 = pass.
import assert from 'node:assert/strict';
import { oracle, sampling, steering, tokenId, validator } from './structured_common.mjs';

const OpenAI = oracle('openai').default ?? oracle('openai');
const { zodResponseFormat, zodFunction } = oracle('openai/helpers/zod');
const { LengthFinishReasonError } = oracle('openai/error');
const { z } = oracle('zod');

const baseURL = process.argv[2];
const client = new OpenAI({ baseURL, apiKey: 'any', maxRetries: 0, timeout: 60_000 });
const model = (await client.models.list()).data[0].id;
const bias = await steering(baseURL);
const messages = [{ role: 'user', content: 'Call a tool.' }];
const SEEDS = [1, 2, 3];

const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather forecast', parameters: {
    type: 'object', properties: {
      city: { type: 'string', enum: ['Rome', 'Paris', 'Oslo'] },
      unit: { enum: ['c', 'f'] },
      days: { type: 'integer', minimum: 1, maximum: 7 },
    }, required: ['city', 'days'], additionalProperties: false } } },
  { type: 'function', function: { name: 'set_alarm', description: 'Set an alarm', parameters: {
    type: 'object', properties: {
      time: { type: 'string', pattern: '^[0-2][0-9]:[0-5][0-9]$' },
      repeat: { type: 'boolean' },
      labels: { type: 'array', items: { type: 'integer', minimum: 0, maximum: 99 }, maxItems: 3 },
    }, required: ['time', 'repeat'], additionalProperties: false } } },
];
// Parallel calls: <|im_end|> no stronger than opening another <tool_call>, so some outputs have several calls.
const parallelBias = { ...bias, [await tokenId(baseURL, '<|im_end|>')]: 5, [await tokenId(baseURL, '<tool_call>')]: 5 };
const validators = Object.fromEntries(tools.map((t) => [t.function.name, validator(t.function.parameters)]));

// Forced calls: every completed response (finish_reason tool_calls) has valid calls; "length" is partial.
async function forced(tool_choice, parallel, only) {
  let done = 0, cut = 0, n = 0;
  for (const seed of SEEDS) {
    const r = await client.chat.completions.create({
      model, messages, tools, tool_choice, parallel_tool_calls: parallel, max_tokens: 192,
      logit_bias: parallel ? parallelBias : bias,
      ...sampling(seed),
    });
    const ch = r.choices[0];
    if (ch.finish_reason === 'length') { cut++; continue; }
    assert.equal(ch.finish_reason, 'tool_calls', JSON.stringify(r));
    const calls = ch.message.tool_calls;
    assert.ok(calls.length >= 1, JSON.stringify(r));
    if (!parallel) assert.equal(calls.length, 1, `parallel_tool_calls false: ${JSON.stringify(calls)}`);
    n += calls.length;
    for (const c of calls) {
      if (only) assert.equal(c.function.name, only);
      assert.ok(validators[c.function.name], `unknown function ${c.function.name}`);
      const args = JSON.parse(c.function.arguments);
      const err = validators[c.function.name](args);
      assert.equal(err, null, `${c.function.name}(${c.function.arguments}): ${err}`);
    }
    done++;
  }
  assert.ok(done >= 1, `no forced call completed (${cut} cut by max_tokens)`);
  console.log(`forced ${JSON.stringify(tool_choice)} parallel=${parallel}: ${done} valid (${n} calls), ${cut} length`);
}
await forced('required', false);
await forced('required', true);
await forced({ type: 'function', function: { name: 'set_alarm' } }, false, 'set_alarm');
await forced({ type: 'function', function: { name: 'get_weather' } }, true, 'get_weather');

// chat.completions.parse: zod (helpers/zod) and a plain json_schema; LengthFinishReasonError = partial.
async function parsed(response_format, check) {
  let done = 0, cut = 0;
  for (const seed of SEEDS) {
    try {
      const r = await client.chat.completions.parse({
        model, messages: [{ role: 'user', content: 'JSON please.' }], response_format, max_tokens: 192,
        logit_bias: bias, ...sampling(seed),
      });
      check(r.choices[0].message.parsed);
      done++;
    } catch (e) {
      if (!(e instanceof LengthFinishReasonError)) throw e;
      cut++;
    }
  }
  assert.ok(done >= 1, `no parse() completed (${cut} cut by max_tokens)`);
  console.log(`parse ${response_format.json_schema.name}: ${done} parsed and valid, ${cut} length`);
}
// No zod .max() on strings: zod counts UTF-16 units, JSON Schema's maxLength (the grammar, ajv) code points,
// so a noise string with an astral character fails zod at maxLength (seen here). A pattern is enforced as is.
const Reading = z.object({
  kind: z.enum(['temp', 'wind']), value: z.number().int().min(-50).max(50), ok: z.boolean(),
  history: z.array(z.number().int().min(0).max(9)).max(3), note: z.string().regex(/^[a-z]{1,6}$/).nullable(),
});
await parsed(zodResponseFormat(Reading, 'reading'), (p) => assert.ok(Reading.safeParse(p).success, JSON.stringify(p)));
const plain = { type: 'object', properties: { id: { type: 'string', format: 'uuid' }, n: { type: 'integer', maximum: -3 } },
  required: ['id', 'n'], additionalProperties: false };
const plainValid = validator(plain);
await parsed({ type: 'json_schema', json_schema: { name: 'plain', schema: plain, strict: true } },
  (p) => assert.equal(plainValid(p), null, JSON.stringify(p)));

// Streaming: the same seed gives the same constrained content and tool calls as the non-streamed request.
for (const extra of [{ response_format: zodResponseFormat(Reading, 'reading') }, { tools, tool_choice: 'required' }]) {
  const body = { model, messages, max_tokens: 96, logit_bias: bias, ...sampling(7), ...extra };
  const a = (await client.chat.completions.create(body)).choices[0];
  let content = '', finish = null;
  const args = [];
  for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) {
    const c = chunk.choices[0];
    if (!c) continue;
    content += c.delta.content ?? '';
    for (const t of c.delta.tool_calls ?? []) args[t.index] = (args[t.index] ?? '') + (t.function?.arguments ?? '');
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(finish, a.finish_reason);
  assert.equal(content, a.message.content ?? '');
  assert.deepEqual(args, (a.message.tool_calls ?? []).map((t) => t.function.arguments));
}

// zodFunction (strict) under a forced call: parsed_arguments come back through zod.
{
  const Alarm = z.object({ hour: z.number().int().min(0).max(23), minute: z.number().int().min(0).max(59), loud: z.boolean() });
  let done = 0;
  for (const seed of SEEDS) {
    const r = await client.chat.completions.parse({
      model, messages, tools: [zodFunction({ name: 'alarm', parameters: Alarm })], tool_choice: 'required',
      max_tokens: 128, logit_bias: bias, ...sampling(seed),
    });
    if (r.choices[0].finish_reason === 'length') continue;
    const call = r.choices[0].message.tool_calls[0];
    assert.ok(Alarm.safeParse(call.function.parsed_arguments).success, call.function.arguments);
    done++;
  }
  assert.ok(done >= 1, 'no zodFunction call completed');
  console.log(`zodFunction: ${done} valid`);
}

// Other request kinds; outputs that stop must match.
async function outputs(extra) {
  const out = [];
  for (const seed of SEEDS) {
    const r = await client.chat.completions.create({ model, messages, max_tokens: 32, logit_bias: bias, ...sampling(seed), ...extra });
    out.push(r.choices[0]);
  }
  return out;
}
for (const [extra, re] of [[{ grammar: 'root ::= ("yes" | "no") ("!" | "")' }, /^(yes|no)!?$/],
  [{ regex: '[a-c]{3}-[0-9]{2}' }, /^[a-c]{3}-[0-9]{2}$/]]) {
  const all = await outputs(extra);
  for (const c of all) if (c.finish_reason === 'stop') assert.match(c.message.content, re);
  assert.ok(all.some((c) => c.finish_reason === 'stop'), JSON.stringify(extra));
}
{
  const all = await outputs({ response_format: { type: 'json_object' } });
  for (const c of all) if (c.finish_reason === 'stop') {
    const v = JSON.parse(c.message.content.trim());
    assert.ok(v && typeof v === 'object' && !Array.isArray(v), c.message.content);
  }
}
{
  const r = await client.chat.completions.create({ model, messages, max_tokens: 8, response_format: { type: 'text' }, ...sampling(1) });
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
}

// Errors: 400 BadRequestError naming the keyword and the schema path, the field in `param`.
async function badRequest(params, param, ...words) {
  try {
    await client.chat.completions.create({ model, messages, max_tokens: 2, ...params });
  } catch (e) {
    assert.ok(e instanceof OpenAI.BadRequestError, `BadRequestError, got ${e}`);
    assert.equal(e.status, 400);
    assert.equal(e.param, param, e.message);
    for (const w of words) assert.ok(e.message.includes(w), `'${w}' not in: ${e.message}`);
    return;
  }
  assert.fail(`no error for ${JSON.stringify(params)}`);
}
await badRequest({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: {
  type: 'object', properties: { n: { type: 'integer', multipleOf: 3 } } } } } },
'response_format.json_schema.schema', 'multipleOf', '#/properties/n');
await badRequest({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: {
  type: 'object', properties: { a: { type: 'array', items: { type: 'string' }, uniqueItems: true } } } } } },
'response_format.json_schema.schema', 'uniqueItems', '#/properties/a');
await badRequest({ tools: [{ type: 'function', function: { name: 'f', parameters: {
  type: 'object', properties: { p: { type: 'object', patternProperties: { '^x': {} } } } } } }], tool_choice: 'required' },
'tools[0].function.parameters', 'patternProperties', '#/properties/p');
await badRequest({ grammar: 'root ::= "a" | (' }, 'grammar');
await badRequest({ grammar: 'start ::= "a"' }, 'grammar', 'root');
await badRequest({ regex: '(a)\\1' }, 'regex');
await badRequest({ tools, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice', 'nope');
console.log('structured openai client: all checks passed');
