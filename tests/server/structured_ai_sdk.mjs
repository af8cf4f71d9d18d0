// Structured output through the Vercel AI SDK (`ai` + `@ai-sdk/openai-compatible`, pinned in tests/oracle)
// against `lily serve --demo` (noise model): generateObject with zod schemas (json_schema, and json_object
// when the provider does not declare structured outputs) and generateText with zod tools under
// toolChoice 'required'; the SDK parses and validates with zod. Outputs cut by max tokens are counted, not
// validated. The schemas keep to what the grammar enforces. Usage: node structured_ai_sdk.mjs BASE_URL.
import assert from 'node:assert/strict';
import { oracle, sampling, steering } from './structured_common.mjs';

const { generateObject, generateText, tool, NoObjectGeneratedError } = oracle('ai');
const { createOpenAICompatible } = oracle('@ai-sdk/openai-compatible');
const { z } = oracle('zod');

globalThis.AI_SDK_LOG_WARNINGS = false;  // the json_object run's expected 'no structuredOutputs' warning
const baseURL = process.argv[2];
const bias = await steering(baseURL);
const lily = createOpenAICompatible({ name: 'lily', baseURL, apiKey: 'any', supportsStructuredOutputs: true });
const model = lily.chatModel('lily-demo');
const SEEDS = [1, 2, 3];
// lily's fields go through the provider's options into the request body.
const opts = (seed) => {
  const { seed: _s, temperature, ...rest } = sampling(seed);
  return { seed, temperature, maxRetries: 0, maxOutputTokens: 192, providerOptions: { lily: { ...rest, logit_bias: bias } } };
};

async function objects(schema, label, extra = {}) {
  let done = 0, cut = 0;
  for (const seed of SEEDS) {
    try {
      const r = await generateObject({ model, schema, prompt: 'JSON please.', ...opts(seed), ...extra });
      assert.ok(schema.safeParse(r.object).success, JSON.stringify(r.object));
      assert.equal(r.finishReason, 'stop');
      done++;
    } catch (e) {
      if (!(NoObjectGeneratedError.isInstance(e) && e.finishReason === 'length')) throw e;
      cut++;
    }
  }
  assert.ok(done >= 1, `${label}: no object completed (${cut} cut by max tokens)`);
  console.log(`generateObject ${label}: ${done} valid, ${cut} length`);
}
const Weather = z.object({
  city: z.enum(['Rome', 'Paris', 'Oslo']), celsius: z.number().int().min(-40).max(45),
  windy: z.boolean(), hours: z.array(z.number().int().min(0).max(23)).max(3),
  note: z.string().regex(/^[a-z]{1,6}$/).nullable(),  // not .max(): zod counts UTF-16 units, the grammar code points
});
await objects(Weather, 'json_schema');
const Pair = z.object({ a: z.number().int().min(0).max(9), b: z.literal('x') });
await objects(Pair, 'json_schema (literal)');
{
  const plain = createOpenAICompatible({ name: 'lily', baseURL, apiKey: 'any' }).chatModel('lily-demo');
  // json_object only: any object parses; the SDK's zod check may then fail on semantics (counted, not asserted).
  let parsedJson = 0;
  for (const seed of SEEDS) {
    try {
      await generateObject({ model: plain, schema: z.object({}).passthrough(), prompt: 'JSON please.', ...opts(seed) });
      parsedJson++;
    } catch (e) {
      if (!(NoObjectGeneratedError.isInstance(e) && e.finishReason === 'length')) throw e;
    }
  }
  assert.ok(parsedJson >= 1, 'json_object: no object completed');
  console.log(`generateObject json_object: ${parsedJson} objects`);
}

// Tools with zod input schemas, toolChoice 'required': the call arrives with arguments zod accepts.
const tools = {
  get_weather: tool({ description: 'Weather forecast', inputSchema: z.object({
    city: z.enum(['Rome', 'Paris', 'Oslo']), days: z.number().int().min(1).max(7) }) }),
  set_alarm: tool({ description: 'Set an alarm', inputSchema: z.object({
    hour: z.number().int().min(0).max(23), loud: z.boolean().optional() }) }),
};
async function calls(toolChoice, only) {
  let done = 0, cut = 0;
  for (const seed of SEEDS) {
    const r = await generateText({ model, tools, toolChoice, prompt: 'Call a tool.', ...opts(seed) });
    if (r.finishReason === 'length') { cut++; continue; }
    assert.equal(r.finishReason, 'tool-calls', r.text);
    assert.ok(r.toolCalls.length >= 1);
    for (const c of r.toolCalls) {
      assert.ok(!c.invalid, `invalid call ${JSON.stringify(c)}`);
      if (only) assert.equal(c.toolName, only);
      assert.ok(tools[c.toolName].inputSchema.safeParse(c.input).success, JSON.stringify(c));
    }
    done++;
  }
  assert.ok(done >= 1, `toolChoice ${JSON.stringify(toolChoice)}: no call completed (${cut} length)`);
  console.log(`generateText toolChoice ${JSON.stringify(toolChoice)}: ${done} valid, ${cut} length`);
}
await calls('required');
await calls({ type: 'tool', toolName: 'set_alarm' }, 'set_alarm');
console.log('structured ai sdk: all checks passed');
