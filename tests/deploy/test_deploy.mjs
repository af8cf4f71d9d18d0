// The fleet test (docs/deploy.md): three `lily serve --demo` replicas on loopback ports behind nginx running the
// shipped deploy/nginx/lily.conf (only its listen port and the replica list are rewritten), each nginx started
// by this script as an unprivileged-config process with its own prefix, pid and log files in a temp dir.
// Checks (a) a conversation's turns land on one replica and hit its prefix cache, requests without a key
// spread; (b) a replica killed mid-run: new requests go to the others, nothing hangs, only in-flight requests
// may fail; (c) a draining replica (SIGTERM) serves no new request while its running one finishes; (d) bursts
// larger than a replica's queue spread over the replicas and none is lost.
// Usage: node tests/deploy/test_deploy.mjs BUILD/lily   (ctest: deploy_nginx_fleet, label deploy)
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const LILY = path.resolve(process.argv[2] ?? 'build/lily');
const SRC = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const NGINX = process.env.NGINX ?? ['/usr/sbin/nginx', '/usr/local/sbin/nginx', '/usr/local/nginx/sbin/nginx']
  .find((p) => fs.existsSync(p));
// The demo model's stop ids, suppressed so that every request generates exactly max_tokens tokens.
const NO_EOS = { 151643: -100, 151645: -100, 151662: -100, 151663: -100, 151664: -100 };
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'lily-deploy-'));
fs.chmodSync(tmp, 0o755);  // run as root, nginx's workers are another user and must reach their files

// The official OpenAI client (tests/oracle, pinned), as a user of the fleet would run it.
const OpenAI = (() => {
  try {
    const m = createRequire(path.join(SRC, 'tests/oracle/package.json'))('openai');
    return m.default ?? m;
  } catch (e) {
    console.error(`the openai npm package is missing: run \`npm ci\` in tests/oracle (scripts/setup.sh does)\n${e}`);
    process.exit(1);
  }
})();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let failures = 0;
function check(cond, what, detail = '') {
  console.log(`  ${cond ? 'ok  ' : 'FAIL'} ${what}${!cond && detail ? `\n       ${detail}` : ''}`);
  if (!cond) failures++;
  return cond;
}

const children = new Set();
function track(proc) {
  children.add(proc);
  proc.exited = new Promise((res) => proc.on('exit', (code, signal) => { children.delete(proc); res({ code, signal }); }));
  return proc;
}
function killAll() { for (const c of children) try { c.kill('SIGKILL'); } catch { /* gone */ } }
process.on('exit', killAll);
for (const s of ['SIGINT', 'SIGTERM']) process.on(s, () => { killAll(); process.exit(2); });

async function withTimeout(promise, ms, what) {
  let timer;
  const t = new Promise((_, rej) => { timer = setTimeout(() => rej(new Error(`timed out after ${ms} ms: ${what}`)), ms); });
  try { return await Promise.race([promise, t]); } finally { clearTimeout(timer); }
}

function freePort() {
  return new Promise((res, rej) => {
    const s = net.createServer();
    s.on('error', rej);
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => res(port)); });
  });
}

class Replica {
  constructor(name, args) {
    this.name = name;
    this.log = path.join(tmp, `${name}.log`);
    const fd = fs.openSync(this.log, 'w');
    this.proc = track(spawn(LILY, ['serve', '--demo', '--host', '127.0.0.1', '--port', '0', ...args], {
      env: { ...process.env, XDG_CACHE_HOME: path.join(path.dirname(LILY), 'test-cache'), LILY_LOG: 'warn' },
      stdio: ['ignore', fd, fd],
    }));
    fs.closeSync(fd);
  }
  get url() { return `http://127.0.0.1:${this.port}`; }
  get addr() { return `127.0.0.1:${this.port}`; }
  async ready(ms = 60000) {
    const t0 = Date.now();
    while (Date.now() - t0 < ms) {
      const text = fs.readFileSync(this.log, 'utf8');
      if (!this.port) this.port = Number(/listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(text)?.[1] ?? 0);
      if (this.proc.exitCode !== null) throw new Error(`${this.name} exited early:\n${text}`);
      if (this.port) {
        try {
          if ((await fetch(`${this.url}/health`, { signal: AbortSignal.timeout(2000) })).status === 200) return this;
        } catch { /* not yet */ }
      }
      await sleep(50);
    }
    throw new Error(`${this.name} not ready after ${ms} ms:\n${fs.readFileSync(this.log, 'utf8')}`);
  }
  // Prometheus text -> {"name{labels}": value}
  async metrics() {
    const text = await (await fetch(`${this.url}/metrics`, { signal: AbortSignal.timeout(5000) })).text();
    const out = {};
    for (const line of text.split('\n')) {
      const m = /^([a-z_]+(?:\{[^}]*\})?) (\S+)$/.exec(line);
      if (m) out[m[1]] = Number(m[2]);
    }
    return out;
  }
  async waitBusy(ms = 10000) {  // until the engine runs a request
    const t0 = Date.now();
    while (Date.now() - t0 < ms) {
      if ((await this.metrics()).lily_requests_running > 0) return true;
      await sleep(10);
    }
    return false;
  }
}

async function startReplicas(n, args) {
  const reps = Array.from({ length: n }, (_, i) => new Replica(`r${i}-${Date.now() % 100000}`, args));
  return Promise.all(reps.map((r) => r.ready()));
}

class Nginx {
  static async start(replicas) {
    const self = new Nginx();
    self.dir = fs.mkdtempSync(path.join(tmp, 'nginx-'));
    fs.chmodSync(self.dir, 0o755);
    self.port = await freePort();
    const shipped = fs.readFileSync(path.join(SRC, 'deploy/nginx/lily.conf'), 'utf8');
    const conf = shipped.replace(/^(\s*)listen 127\.0\.0\.1:8080;/m, `$1listen 127.0.0.1:${self.port};`);
    if (conf === shipped) throw new Error('deploy/nginx/lily.conf: no `listen 127.0.0.1:8080;` line to rewrite');
    // The replica lists keep the shipped server parameters (max_fails, fail_timeout); only the addresses change.
    fs.writeFileSync(path.join(self.dir, 'lily.conf'), conf);
    for (const file of ['lily-replicas.conf', 'lily-spill.conf']) {
      const list = fs.readFileSync(path.join(SRC, 'deploy/nginx', file), 'utf8');
      const params = /^server 127\.0\.0\.1:\d+((?: [^;]*)?);$/m.exec(list);
      if (!params) throw new Error(`deploy/nginx/${file}: no \`server 127.0.0.1:PORT ...;\` line`);
      fs.writeFileSync(path.join(self.dir, file), replicas.map((r) => `server ${r.addr}${params[1]};`).join('\n') + '\n');
    }
    const d = self.dir;
    fs.writeFileSync(path.join(d, 'nginx.conf'), `
worker_processes 2;
pid ${d}/nginx.pid;
error_log ${d}/error.log info;
events { worker_connections 1024; }
http {
  log_format fleet '$request_uri key=$http_x_conversation_id upstream=$upstream_addr status=$upstream_status -> $status';
  access_log ${d}/access.log fleet;
  client_body_temp_path ${d}/client_body;
  proxy_temp_path ${d}/proxy;
  fastcgi_temp_path ${d}/fastcgi;
  uwsgi_temp_path ${d}/uwsgi;
  scgi_temp_path ${d}/scgi;
  include ${d}/lily.conf;
}
`);
    const fd = fs.openSync(path.join(d, 'stderr.log'), 'w');
    self.proc = track(spawn(NGINX, ['-p', `${d}/`, '-c', `${d}/nginx.conf`, '-e', `${d}/error.log`, '-g', 'daemon off;'],
      { stdio: ['ignore', fd, fd] }));
    fs.closeSync(fd);
    const t0 = Date.now();
    while (Date.now() - t0 < 10000) {
      if (self.proc.exitCode !== null) break;
      try {
        await fetch(`${self.url}/livez`, { signal: AbortSignal.timeout(1000) });
        return self;
      } catch { await sleep(50); }
    }
    throw new Error(`nginx did not start:\n${fs.readFileSync(path.join(d, 'stderr.log'), 'utf8')}` +
      `${fs.existsSync(path.join(d, 'error.log')) ? fs.readFileSync(path.join(d, 'error.log'), 'utf8') : ''}`);
  }
  get url() { return `http://127.0.0.1:${this.port}`; }
  async stop() {
    this.proc.kill('SIGTERM');
    await withTimeout(this.proc.exited, 10000, 'nginx stop');
  }
}

// One chat completion through `base`; never throws: {status, json, tried (replicas nginx tried, in order),
// served (the one that answered), error}. status -1: the transfer failed (reset, cut stream, timeout).
async function chat(base, messages, { key, max_tokens = 8, stream = false, timeoutMs = 60000 } = {}) {
  const headers = { 'Content-Type': 'application/json' };
  if (key) headers['X-Conversation-Id'] = key;
  const body = { model: 'lily-demo-noise', messages, max_tokens, temperature: 0, logit_bias: NO_EOS, stream };
  if (key) body.prompt_cache_key = key;  // what an OpenAI client sends too; lily accepts it, nginx hashes the header
  let tried = [];
  try {
    const r = await fetch(`${base}/v1/chat/completions`,
      { method: 'POST', headers, body: JSON.stringify(body), signal: AbortSignal.timeout(timeoutMs) });
    tried = (r.headers.get('x-lily-upstream') ?? '').split(/\s*[,:]\s+/).filter(Boolean);
    const text = await r.text();
    let json = null;
    try { json = JSON.parse(text); } catch { /* SSE or error text */ }
    return { status: r.status, json, text, tried, served: tried.at(-1), retryAfter: r.headers.get('retry-after') };
  } catch (e) {
    return { status: -1, error: String(e?.cause ?? e), tried };
  }
}

function sseDone(text) {
  return typeof text === 'string' && /\ndata: \[DONE\]\n/.test(`\n${text}`);
}

// ---------------------------------------------------------------------------------------------------------------
async function affinity() {
  console.log('(a) conversation affinity and prefix-cache hits');
  const reps = await startReplicas(3, ['--queue', '4']);
  const lb = await Nginx.start(reps);
  const byAddr = Object.fromEntries(reps.map((r) => [r.addr, r]));
  const placed = {};
  let sticky = 0, hits = 0, convs = 12, control = null;
  for (let i = 0; i < convs; ++i) {
    const key = `conv-${i}-${process.pid}`;
    let notes = `Conversation ${i}. Please summarise these notes. `;
    for (let k = 0; k < 30; ++k) notes += `Note ${k} of ${i}: the quick brown fox jumps. `;
    const msgs = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: notes }];
    const t1 = await chat(lb.url, msgs, { key });
    if (!check(t1.status === 200, `conversation ${i} turn 1: 200`, t1.text ?? t1.error)) continue;
    const m = t1.json.choices[0].message;
    msgs.push({ role: 'assistant', content: m.content ?? '', ...(m.reasoning_content ? { reasoning_content: m.reasoning_content } : {}) });
    msgs.push({ role: 'user', content: 'And in one word?' });
    const t2 = await chat(lb.url, msgs, { key, max_tokens: 4 });
    if (!check(t2.status === 200, `conversation ${i} turn 2: 200`, t2.text ?? t2.error)) continue;
    const cached = t2.json.usage?.prompt_tokens_details?.cached_tokens ?? 0;
    if (t1.served === t2.served && t1.tried.length === 1 && t2.tried.length === 1) sticky++;
    else console.log(`       conversation ${i}: turn 1 via ${t1.tried}, turn 2 via ${t2.tried}`);
    if (cached > 0) hits++;
    else console.log(`       conversation ${i}: turn 2 cached_tokens ${cached} of ${t2.json.usage?.prompt_tokens}`);
    placed[t1.served] = (placed[t1.served] ?? 0) + 1;
    if (!control) control = { msgs, served: t1.served };
  }
  check(sticky === convs, `every conversation's two turns answered by one replica (${sticky}/${convs})`);
  check(hits === convs, `every second turn hit the prefix cache: cached_tokens > 0 (${hits}/${convs})`);
  check(Object.keys(placed).length >= 2, `conversations spread over the replicas by their key: ${JSON.stringify(placed)}`);
  // The same through the OpenAI client: the conversation key as a default header of the client (and as
  // prompt_cache_key in the body, which lily accepts).
  {
    const key = `sdk-conv-${process.pid}`;
    const client = new OpenAI({ baseURL: `${lb.url}/v1`, apiKey: 'any', maxRetries: 0, timeout: 60000,
      defaultHeaders: { 'X-Conversation-Id': key } });
    let notes = 'Please summarise these notes for the SDK. ';
    for (let k = 0; k < 30; ++k) notes += `SDK note ${k}: the lazy dog sleeps. `;
    const msgs = [{ role: 'user', content: notes }];
    const one = await client.chat.completions.create({ model: 'lily-demo-noise', messages: msgs, max_tokens: 8,
      logit_bias: NO_EOS, prompt_cache_key: key, user: 'alice' }).withResponse();
    msgs.push({ role: 'assistant', content: one.data.choices[0].message.content ?? '' });
    msgs.push({ role: 'user', content: 'Shorter.' });
    const two = await client.chat.completions.create({ model: 'lily-demo-noise', messages: msgs, max_tokens: 4,
      prompt_cache_key: key, user: 'alice' }).withResponse();
    const via = [one, two].map((x) => x.response.headers.get('x-lily-upstream'));
    check(via[0] === via[1] && two.data.usage.prompt_tokens_details.cached_tokens > 0,
      `OpenAI client with defaultHeaders: both turns on ${via[0]}, turn 2 cached_tokens ` +
      `${two.data.usage.prompt_tokens_details.cached_tokens} of ${two.data.usage.prompt_tokens}`, JSON.stringify(via));
  }
  // Control: the same second turn on another replica finds nothing cached; the hits above come from affinity.
  const other = reps.find((r) => r.addr !== control.served);
  const miss = await chat(other.url, control.msgs, { max_tokens: 4 });
  check(miss.status === 200 && miss.json.usage.prompt_tokens_details.cached_tokens === 0,
    'control: that turn on another replica has cached_tokens 0', miss.text);
  // Without a key: least connections, so concurrent requests use every replica.
  const free = await Promise.all(Array.from({ length: 6 }, (_, i) =>
    chat(lb.url, [{ role: 'user', content: `no key ${i}` }], { max_tokens: 200 })));
  const used = new Set(free.map((r) => r.served));
  check(free.every((r) => r.status === 200), 'requests without a key: all 200');
  check(used.size === 3, `requests without a key spread by least load over all 3 replicas (${[...used].map((a) => byAddr[a]?.name)})`);
  await lb.stop();
  await Promise.all(reps.map(async (r) => { r.proc.kill('SIGTERM'); await withTimeout(r.proc.exited, 30000, 'replica stop'); }));
}

async function burst() {
  console.log('(d) bursts larger than one replica\'s queue (--queue 1: one running + one waiting per replica)');
  const reps = await startReplicas(3, ['--queue', '1', '--max-seqs', '1']);
  let lb = await Nginx.start(reps);
  const byAddr = Object.fromEntries(reps.map((r) => [r.addr, r]));
  const m0 = await reps[0].metrics();
  check(m0.lily_queue_capacity === 1 && m0.lily_sequence_slots === 1 && m0.lily_sequence_slots_free === 1,
    '/metrics: queue capacity 1, one sequence slot, free while idle');

  // One conversation key for all: every request hashes to the same replica, which takes two and answers 429
  // to the rest; nginx passes those on to the next replicas of the ring.
  const n1 = 6;
  const hot = await Promise.all(Array.from({ length: n1 }, (_, i) =>
    chat(lb.url, [{ role: 'user', content: `hot ${i}` }], { key: 'one-hot-conversation', max_tokens: 300 })));
  const served1 = {};
  for (const r of hot) served1[byAddr[r.served]?.name ?? r.served] = (served1[byAddr[r.served]?.name ?? r.served] ?? 0) + 1;
  check(hot.every((r) => r.status === 200), `${n1} requests on one key, 3 replicas x 2 places: all 200`,
    hot.map((r) => `${r.status} ${r.tried}`).join(' | '));
  check(hot.some((r) => r.tried.length > 1), 'the key\'s replica was full and nginx retried the rest elsewhere',
    hot.map((r) => r.tried.join('>')).join(' | '));
  check(Object.keys(served1).length === 3, `they spread over every replica: ${JSON.stringify(served1)}`);
  const rejected = (await Promise.all(reps.map((r) => r.metrics())))
    .reduce((s, m) => s + (m['lily_requests_rejected_total{reason="queue_full"}'] ?? 0), 0);
  check(rejected > 0, `the replicas answered 429 queue_full (${rejected} times) and the clients never saw it`);
  await lb.stop();  // a fresh nginx: the 429s above count as failed attempts (max_fails)

  // More than the fleet holds at once, through the OpenAI client: the client sees 429 + Retry-After only when
  // every replica is full, and retries after Retry-After (its own retry loop); nothing is lost.
  lb = await Nginx.start(reps);
  const n2 = 15;
  let saw429 = 0, badRetryAfter = 0;
  const countingFetch = async (url, init) => {
    const r = await fetch(url, init);
    if (r.status === 429) {
      saw429++;
      if (!(Number(r.headers.get('retry-after')) >= 1)) badRetryAfter++;
    }
    return r;
  };
  const client = new OpenAI({ baseURL: `${lb.url}/v1`, apiKey: 'any', maxRetries: 40, timeout: 60000, fetch: countingFetch });
  const big = await Promise.all(Array.from({ length: n2 }, async (_, i) => {
    try {
      const { response } = await client.chat.completions.create({ model: 'lily-demo-noise', max_tokens: 150,
        logit_bias: NO_EOS, messages: [{ role: 'user', content: `burst ${i}` }] }).withResponse();
      const tried = (response.headers.get('x-lily-upstream') ?? '').split(/\s*[,:]\s+/).filter(Boolean);
      return { status: response.status, served: tried.at(-1) };
    } catch (e) {
      return { status: e.status ?? -1, error: String(e) };
    }
  }));
  const served2 = {};
  for (const r of big) served2[byAddr[r.served]?.name ?? r.served] = (served2[byAddr[r.served]?.name ?? r.served] ?? 0) + 1;
  check(big.every((r) => r.status === 200), `${n2} concurrent requests, 6 places in the fleet: every one completed`,
    big.map((r) => r.status).join(' '));
  check(saw429 > 0 && badRetryAfter === 0, `a full fleet answered 429 with Retry-After >= 1 (${saw429} times) and the client retried`);
  check(Object.keys(served2).length === 3, `spread over every replica: ${JSON.stringify(served2)}`);
  await lb.stop();
  await Promise.all(reps.map(async (r) => { r.proc.kill('SIGTERM'); await withTimeout(r.proc.exited, 30000, 'replica stop'); }));
}

// A key that the fleet's hash sends to some replica, and that replica.
async function keyAndReplica(lb, reps, prefix) {
  const key = `${prefix}-${process.pid}`;
  const r = await chat(lb.url, [{ role: 'user', content: 'where' }], { key, max_tokens: 1 });
  if (r.status !== 200) throw new Error(`probe request failed: ${r.status} ${r.text ?? r.error}`);
  return { key, rep: reps.find((x) => x.addr === r.served) };
}

async function drain() {
  console.log('(c) a draining replica (SIGTERM) gets no new requests; its running request finishes');
  const reps = await startReplicas(3, ['--queue', '4', '--drain', '30']);
  const lb = await Nginx.start(reps);
  const { key, rep } = await keyAndReplica(lb, reps, 'drain');
  const long = chat(lb.url, [{ role: 'user', content: 'a long answer' }], { key, max_tokens: 1200, stream: true });
  check(await rep.waitBusy(), `${rep.name} runs the conversation's long streamed request`);
  rep.proc.kill('SIGTERM');
  let draining = false;
  for (let i = 0; i < 200 && !draining; ++i) {
    try { draining = (await fetch(`${rep.url}/health`, { signal: AbortSignal.timeout(1000) })).status === 503; } catch { break; }
    if (!draining) await sleep(10);
  }
  check(draining, `${rep.name}: /health 503 while draining`);
  const fresh = [];
  for (let i = 0; i < 12; ++i)
    fresh.push(await chat(lb.url, [{ role: 'user', content: `during drain ${i}` }], { key: i % 2 ? key : undefined, max_tokens: 8 }));
  check(fresh.every((r) => r.status === 200), '12 new requests during the drain (half on the draining replica\'s key): all 200',
    fresh.map((r) => `${r.status} ${r.tried}`).join(' | '));
  check(fresh.every((r) => r.served && r.served !== rep.addr), 'none of them was served by the draining replica',
    fresh.map((r) => r.tried.join('>')).join(' | '));
  console.log(`       ${fresh.filter((r) => r.tried[0] === rep.addr).length} of them tried the draining replica first ` +
    '(503 shutting_down or connection refused) and were passed on');
  const l = await withTimeout(long, 60000, 'the in-flight stream');
  check(l.status === 200 && sseDone(l.text) && /"finish_reason":"length"/.test(l.text),
    'the in-flight stream finished on the draining replica (finish_reason length, [DONE])', l.error ?? l.text?.slice(-300));
  const ex = await withTimeout(rep.proc.exited, 40000, 'drained replica exit');
  check(ex.code === 0, `the drained replica exited 0 (${JSON.stringify(ex)})`);
  await lb.stop();
  await Promise.all(reps.filter((r) => r !== rep).map(async (r) => { r.proc.kill('SIGTERM'); await withTimeout(r.proc.exited, 30000, 'replica stop'); }));
}

async function killed() {
  console.log('(b) a replica killed mid-run (SIGKILL)');
  const reps = await startReplicas(3, ['--queue', '4']);
  const lb = await Nginx.start(reps);
  const { key, rep } = await keyAndReplica(lb, reps, 'kill');
  // In flight on the doomed replica: two streams and a plain request, batched together.
  const inflight = [
    chat(lb.url, [{ role: 'user', content: 'doomed 0' }], { key, max_tokens: 1500, stream: true, timeoutMs: 30000 }),
    chat(lb.url, [{ role: 'user', content: 'doomed 1' }], { key, max_tokens: 1500, stream: true, timeoutMs: 30000 }),
    chat(lb.url, [{ role: 'user', content: 'doomed 2' }], { key, max_tokens: 200, timeoutMs: 30000 }),
  ];
  check(await rep.waitBusy(), `${rep.name} runs the in-flight requests`);
  await sleep(200);
  rep.proc.kill('SIGKILL');
  await withTimeout(rep.proc.exited, 10000, 'killed replica');
  const t0 = Date.now();
  const fresh = [];
  for (let i = 0; i < 12; ++i)
    fresh.push(await chat(lb.url, [{ role: 'user', content: `after kill ${i}` }], { key: i % 2 ? key : undefined, max_tokens: 8, timeoutMs: 20000 }));
  const freshS = (Date.now() - t0) / 1000;
  check(fresh.every((r) => r.status === 200), '12 new requests after the kill (half on the dead replica\'s key): all 200',
    fresh.map((r) => `${r.status} ${r.tried} ${r.error ?? ''}`).join(' | '));
  check(fresh.every((r) => r.served && r.served !== rep.addr), 'all answered by the surviving replicas');
  check(freshS < 15, `and promptly (${freshS.toFixed(1)} s for 12 sequential requests)`);
  const done = await withTimeout(Promise.all(inflight), 40000, 'the in-flight requests');
  const failed = done.filter((r) => r.status !== 200 || (r.text?.startsWith('data:') && !sseDone(r.text)));
  console.log(`       in flight at the kill: ${done.map((r) => (r.status === 200 ? (r.text.startsWith('data:') && !sseDone(r.text) ? 'cut' : `200 via ${r.tried.join('>')}`) : `${r.status} ${r.error ?? ''}`)).join(' | ')}`);
  check(done.length === inflight.length, `the ${inflight.length} requests in flight at the kill all ended, none hung ` +
    `(${failed.length} failed, ${inflight.length - failed.length} completed)`);
  await lb.stop();
  await Promise.all(reps.filter((r) => r !== rep).map(async (r) => { r.proc.kill('SIGTERM'); await withTimeout(r.proc.exited, 30000, 'replica stop'); }));
}

async function main() {
  if (!NGINX) {
    console.error('nginx not found (scripts/setup.sh installs Debian\'s nginx; or set NGINX=/path/to/nginx)');
    process.exit(1);
  }
  if (!fs.existsSync(LILY)) { console.error(`no lily binary at ${LILY}`); process.exit(1); }
  console.log(`lily ${LILY}, nginx ${NGINX}, files in ${tmp}`);
  const t0 = Date.now();
  for (const phase of [affinity, burst, drain, killed]) {
    try { await withTimeout(phase(), 120000, phase.name); } catch (e) { check(false, `${phase.name}: ${e.message}`); killAll(); }
  }
  console.log(`${failures ? `${failures} check(s) FAILED` : 'all checks passed'} in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  if (!failures && !process.env.LILY_KEEP_TMP) fs.rmSync(tmp, { recursive: true, force: true });
  else console.log(`logs kept in ${tmp}`);
  process.exit(failures ? 1 : 0);
}

main();
