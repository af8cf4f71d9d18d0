// The oracle side of bench_tokenizer: HF `tokenizers` (npm @anush008/tokenizers, tests/oracle) load time and
// single-thread encode throughput on the same corpus (cases.json from tests/tokenizer/oracle_corpus.js).
// Usage: RAYON_NUM_THREADS=1 node bench/bench_tokenizer_oracle.js TOKENIZER_JSON CORPUS_JSON [REPEATS=5]
// Encodes are awaited one at a time, so one encode runs at any moment; CPU time is process CPU (all threads).
'use strict';
const fs = require('fs');
const path = require('path');
const tk = require(path.join(__dirname, '..', 'tests', 'oracle', 'node_modules', '@anush008', 'tokenizers'));

const [file, corpusFile, rep] = process.argv.slice(2);
const repeats = Number(rep || 5);
const median = (v) => v.slice().sort((a, b) => a - b)[Math.floor(v.length / 2)];
const now = () => [performance.now() / 1e3, process.cpuUsage()];
const since = ([w, c]) => { const u = process.cpuUsage(c); return [performance.now() / 1e3 - w, (u.user + u.system) / 1e6]; };

(async () => {
  const loads = [];
  let tok;
  for (let r = 0; r < 3; r++) { const t0 = now(); tok = tk.Tokenizer.fromFile(file); loads.push(since(t0)); }
  const texts = JSON.parse(fs.readFileSync(corpusFile, 'utf8')).map((c) => c.t);
  const bytes = texts.reduce((a, t) => a + Buffer.byteLength(t), 0);
  const joined = texts.join('');
  console.log(`oracle ${file}: load median wall ${(1e3 * median(loads.map((x) => x[0]))).toFixed(1)} ms, ` +
              `cpu ${(1e3 * median(loads.map((x) => x[1]))).toFixed(1)} ms`);
  console.log(`corpus ${corpusFile}: ${texts.length} strings, ${(bytes / 1e6).toFixed(2)} MB`);
  const opts = { addSpecialTokens: false };
  let tokens = 0;
  for (const t of texts) tokens += (await tok.encode(t, null, opts)).getLength();  // warm-up
  const per = [], jn = [];
  let jtokens = 0;
  for (let r = 0; r < repeats; r++) {
    let t0 = now();
    for (const t of texts) await tok.encode(t, null, opts);
    per.push(since(t0));
    t0 = now();
    jtokens = (await tok.encode(joined, null, opts)).getLength();
    jn.push(since(t0));
  }
  const report = (what, v, toks) => {
    const w = median(v.map((x) => x[0])), c = median(v.map((x) => x[1]));
    console.log(`${what.padEnd(22)} wall ${(1e3 * w).toFixed(1).padStart(7)} ms  ${(bytes / 1e6 / w).toFixed(2).padStart(6)} MB/s  ` +
                `${(toks / w).toFixed(0).padStart(9)} tok/s | cpu ${(1e3 * c).toFixed(1).padStart(7)} ms  ` +
                `${(bytes / 1e6 / c).toFixed(2).padStart(6)} MB/s  ${(toks / c).toFixed(0).padStart(9)} tok/s`);
  };
  report('encode per string', per, tokens);
  report('encode joined text', jn, jtokens);
})();
