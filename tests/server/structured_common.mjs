// Helpers shared by the structured-output client tests (structured_openai.mjs, structured_ai_sdk.mjs): the
// oracle packages (tests/oracle), ajv, token ids through /tokenize, and the sampling fields the tests send.
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const oracle = createRequire(path.join(here, '../oracle/package.json'));

const Ajv2020 = oracle('ajv/dist/2020').default;
const addFormats = oracle('ajv-formats').default;

// A validator for `schema` (JSON Schema 2020-12 with formats); returns null when valid, else the errors.
export function validator(schema) {
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  addFormats(ajv);
  const v = ajv.compile(schema);
  return (value) => (v(value) ? null : JSON.stringify(v.errors));
}

// The id of a text that is one token of the served vocabulary (special tokens parsed).
export async function tokenId(baseURL, text) {
  const r = await fetch(new URL('/tokenize', baseURL), {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ content: text }),
  });
  const j = await r.json();
  if (j.tokens?.length !== 1) throw new Error(`'${text}' is not one token: ${JSON.stringify(j)}`);
  return j.tokens[0];
}

// logit_bias toward closing tokens and <|im_end|>: the demo model's noise then completes structures within a
// few dozen tokens; the grammar still decides which tokens are allowed.
export async function steering(baseURL) {
  const bias = {};
  for (const t of ['"', '}', ']', '"}', '}]', '</tool_call>']) bias[await tokenId(baseURL, t)] = 6;
  bias[await tokenId(baseURL, '<|im_end|>')] = 20;
  return bias;
}

// Random sampling at temperature 1, thinking off (lily's request extensions pass through the clients).
export const sampling = (seed) => ({
  seed, temperature: 1, top_p: 1, top_k: 0, min_p: 0, presence_penalty: 0,
  chat_template_kwargs: { enable_thinking: false },
});
