// lib.mjs -- what the `ringlm serve` tests share: a tiny test runner,
// checks that say expected vs got, a server child per test (never left
// running), raw HTTP and SSE clients, `ringlm run` / `ringlm tokenize`
// for expected outputs, and a Prometheus text parser. Node's standard
// library only.
//
// Environment (set by tests/CMakeLists.txt): RINGLM_BIN (the ringlm
// binary), RINGLM_SOURCE_DIR, RINGLM_TEST_SLOW (time factor: 4 under
// ASan+UBSan), RINGLM_TEST_DEADLINE (seconds before ctest's TIMEOUT: the
// runner kills its servers and fails by then), RINGLM_TEST_ONLY (a regex:
// run only the tests whose names match).
import { spawn, execFile } from 'node:child_process';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { isDeepStrictEqual, inspect } from 'node:util';

export const BIN = process.env.RINGLM_BIN;
export const SRC = process.env.RINGLM_SOURCE_DIR;
export const SLOW = Number(process.env.RINGLM_TEST_SLOW || 1);
export const MODEL_NAME = 'brown-15m-4bit';
export const MODEL_DIR = SRC && path.join(SRC, 'models', MODEL_NAME);
export const DRAFT_DIR = SRC && path.join(SRC, 'models', 'brown-draft-1m-4bit');
export const SKIP = 77; // SKIP_RETURN_CODE of the ctest registrations

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/* Polls pred (sync or async) every 10 ms until it holds; fails after ms. */
export async function waitFor(pred, what, ms = 30000 * SLOW) {
  const limit = Date.now() + ms;
  while (!(await pred())) {
    if (Date.now() > limit) fail(`no ${what} in ${ms} ms`);
    await sleep(10);
  }
}
const fmt = (v) => (typeof v === 'string' ? JSON.stringify(v) : inspect(v, { depth: 4, breakLength: 120 }));

// ---- checks ---------------------------------------------------------------

export class CheckError extends Error {}

export function fail(msg) {
  throw new CheckError(msg);
}
export function eq(got, want, what) {
  if (!isDeepStrictEqual(got, want)) fail(`${what}: expected ${fmt(want)}, got ${fmt(got)}`);
}
export function ok(cond, what, got) {
  if (!cond) fail(arguments.length > 2 ? `${what}; got ${fmt(got)}` : what);
}
export function isInt(v, what) {
  ok(Number.isInteger(v), `${what}: expected an integer`, v);
}
export function between(v, lo, hi, what) {
  ok(typeof v === 'number' && v >= lo && v <= hi, `${what}: expected a number in [${lo}, ${hi}]`, v);
}
export function type(v, t, what) {
  ok(typeof v === t && v !== null, `${what}: expected a ${t}`, v);
}
/* The JSON body of a response with this status. */
export function status(res, want, what) {
  if (res.status !== want)
    fail(`${what}: expected HTTP ${want}, got ${res.status} ${res.text.slice(0, 400)}`);
  return res.json;
}
/* An OpenAI error object {"error": {"message", "type", "param", "code"}}. */
export function errorBody(res, st, what, { type: t, param } = {}) {
  status(res, st, what);
  ok(/^application\/json/.test(res.headers['content-type'] || ''),
    `${what}: expected Content-Type application/json`, res.headers['content-type']);
  const e = res.json && res.json.error;
  ok(e && typeof e === 'object', `${what}: expected {"error": {...}}`, res.text);
  type(e.message, 'string', `${what}: error.message`);
  ok(e.message.length > 0, `${what}: error.message is empty`);
  for (const k of ['type', 'param', 'code']) ok(k in e, `${what}: error.${k} missing`, e);
  if (t !== undefined) eq(e.type, t, `${what}: error.type`);
  if (param !== undefined) eq(e.param, param, `${what}: error.param`);
  return e;
}

// ---- runner -----------------------------------------------------------------

const tests = [];
export function test(name, fn) {
  tests.push({ name, fn });
}

/* Runs the tests in order; exits 0, 1 (a failure) or 77 (skipped). */
export async function main() {
  const deadline = Number(process.env.RINGLM_TEST_DEADLINE || 0);
  if (deadline > 0)
    setTimeout(() => {
      console.log(`FAIL: still running after ${deadline} s (RINGLM_TEST_DEADLINE); stopping the servers`);
      killAll();
      process.exit(1);
    }, deadline * 1000).unref();
  if (!BIN) {
    console.log('FAIL: RINGLM_BIN is not set');
    process.exit(1);
  }
  let passed = 0, failed = 0;
  // RINGLM_TEST_ONLY=REGEX: only the tests whose names match (debugging).
  const only = process.env.RINGLM_TEST_ONLY && new RegExp(process.env.RINGLM_TEST_ONLY);
  for (const t of tests.filter((x) => !only || only.test(x.name))) {
    const t0 = Date.now();
    try {
      await t.fn();
      passed++;
      console.log(`ok   ${t.name} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${t.name} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
      console.log('     ' + (e instanceof CheckError ? e.message : e.stack || String(e)).replace(/\n/g, '\n     '));
    }
  }
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

/* Skips the whole test (ctest's skip code), or fails under CI=true. */
export function skip(reason) {
  killAll();
  if (process.env.CI === 'true') {
    console.log(`FAIL: would skip, but CI=true: ${reason}`);
    process.exit(1);
  }
  console.log(`skipped: ${reason}`);
  process.exit(SKIP);
}

// ---- the server child -----------------------------------------------------

const live = new Set();
function killAll() {
  for (const s of live) s.kill('SIGKILL');
}
process.on('exit', killAll);
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'])
  process.on(sig, () => {
    killAll();
    process.exit(1);
  });

const URL_RE = /http:\/\/127\.0\.0\.1:(\d+)/;

export class Server {
  constructor(args, env) {
    this.args = ['serve', '--port', '0', ...args];
    this.proc = spawn(BIN, this.args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
    live.add(this.proc);
    this.stdout = '';
    this.stderr = '';
    this.proc.stdout.on('data', (d) => (this.stdout += d));
    this.proc.stderr.on('data', (d) => {
      this.stderr += d;
      if (this.stderr.length > 200000) this.stderr = this.stderr.slice(-100000);
    });
    this.exited = new Promise((resolve) =>
      this.proc.on('exit', (code, signal) => {
        live.delete(this.proc);
        resolve({ code, signal });
      }));
  }

  /* `ringlm serve ARGS` on a free port, its startup line read and
   * /health answering 200. */
  static async start(args = [], env = {}) {
    const s = new Server(args, env);
    try {
      await s.#ready();
    } catch (e) {
      s.proc.kill('SIGKILL');
      throw e;
    }
    return s;
  }

  async #ready() {
    const limit = Date.now() + 30000 * SLOW;
    let exit = null;
    this.exited.then((x) => (exit = x));
    while (!this.stdout.includes('\n')) {
      if (exit) fail(`ringlm ${this.args.join(' ')} exited (${exit.code ?? exit.signal}) before its startup line; stderr:\n${this.tail()}`);
      if (Date.now() > limit) fail(`ringlm ${this.args.join(' ')}: no startup line; stdout ${fmt(this.stdout)}, stderr:\n${this.tail()}`);
      await sleep(20);
    }
    this.line = this.stdout.slice(0, this.stdout.indexOf('\n'));
    const m = URL_RE.exec(this.line);
    ok(m, `startup line: expected http://127.0.0.1:PORT`, this.line);
    this.port = Number(m[1]);
    this.url = `http://127.0.0.1:${this.port}`;
    for (;;) {
      if (exit) fail(`ringlm serve exited (${exit.code ?? exit.signal}) before /health answered; stderr:\n${this.tail()}`);
      try {
        const r = await this.get('/health');
        if (r.status === 200) return;
      } catch {}
      if (Date.now() > limit) fail(`GET /health never answered 200; stderr:\n${this.tail()}`);
      await sleep(50);
    }
  }

  tail(n = 3000) {
    return this.stderr.slice(-n);
  }
  get pid() {
    return this.proc.pid;
  }
  request(method, p, opts) {
    return request(this.port, method, p, opts);
  }
  get(p, opts) {
    return request(this.port, 'GET', p, opts);
  }
  post(p, body, opts = {}) {
    return request(this.port, 'POST', p, { ...opts, body });
  }
  stream(p, body, opts) {
    return new Stream(this.port, p, body, opts);
  }
  async health() {
    return status(await this.get('/health'), 200, 'GET /health');
  }
  async metrics() {
    const r = await this.get('/metrics');
    status(r, 200, 'GET /metrics');
    return parseMetrics(r.text);
  }

  /* SIGTERM (signal null: none, it was sent), and the exit status within
   * the time limit (SIGKILL after). */
  async stop(signal = 'SIGTERM', ms = 15000 * SLOW) {
    if (signal && live.has(this.proc)) this.proc.kill(signal);
    const t = setTimeout(() => this.proc.kill('SIGKILL'), ms);
    const x = await this.exited;
    clearTimeout(t);
    return x;
  }
}

/* Runs fn(server) and stops the server; a server that does not exit 0 on
 * SIGTERM (a crash, a sanitizer report, a hang) fails the test. */
export async function withServer(args, fn, env) {
  return withServers([[args, env]], (s) => fn(s[0]));
}

/* withServer for several servers at once: fn([server, ...]). */
export async function withServers(specs, fn) {
  const ss = [];
  let result;
  try {
    for (const [args, env] of specs) ss.push(await Server.start(args, env));
    result = await fn(ss);
  } catch (e) {
    for (const s of ss) s.proc.kill('SIGKILL');
    // The servers' stderr (a sanitizer report, an assertion) goes with it.
    const more = ss.filter((s) => s.stderr).map((s) => `\n--- stderr of ringlm ${s.args.join(' ')} (tail) ---\n${s.tail()}`).join('');
    if (e instanceof CheckError) e.message += more;
    else if (e instanceof Error) e.stack = `${e.stack}${more}`;
    throw e;
  }
  for (const s of ss) {
    const x = await s.stop();
    if (x.code !== 0)
      fail(`ringlm ${s.args.join(' ')}: expected exit 0 on SIGTERM, got ${x.code ?? x.signal}; stderr:\n${s.tail()}`);
  }
  return result;
}

// ---- HTTP -------------------------------------------------------------------

/* One request on a fresh connection: {status, headers, body (Buffer),
 * text, json (undefined unless the body parses), socket (the local port)}.
 * An object body is sent as JSON; a string or Buffer as it is. */
export function request(port, method, p, { body, headers = {}, timeout = 120000 * SLOW, chunked = false, agent = false } = {}) {
  return new Promise((resolve, reject) => {
    let data = body;
    const h = { ...headers };
    if (data !== undefined && typeof data !== 'string' && !Buffer.isBuffer(data)) {
      data = JSON.stringify(data);
      h['Content-Type'] ??= 'application/json';
    }
    if (data !== undefined && !chunked) h['Content-Length'] = Buffer.byteLength(data);
    const req = http.request({ host: '127.0.0.1', port, method, path: p, headers: h, agent, timeout });
    let answered = false;
    req.on('response', (res) => {
      answered = true;
      const parts = [];
      res.on('data', (d) => parts.push(d));
      res.on('error', reject);
      res.on('end', () => {
        const buf = Buffer.concat(parts);
        const text = buf.toString('utf8');
        let json;
        try {
          json = JSON.parse(text);
        } catch {}
        resolve({ status: res.statusCode, headers: res.headers, body: buf, text, json, socket: req.socket && req.socket.localPort });
      });
    });
    req.on('timeout', () => req.destroy(new Error(`${method} ${p}: no answer in ${timeout} ms`)));
    // A server may answer (413) and close before it read the whole body.
    req.on('error', (e) => {
      if (!answered) reject(e);
    });
    if (data !== undefined) {
      if (chunked) for (let i = 0; i < data.length; i += 4096) req.write(data.slice(i, i + 4096));
      else req.write(data);
    }
    req.end();
  });
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
const fatalUtf8 = () => new TextDecoder('utf-8', { fatal: true });

/* A streaming POST: the body's SSE events as they arrive. Each event's raw
 * bytes must decode as UTF-8 on their own (no character split between
 * chunks); `brokenUtf8` lists the ones that did not. */
export class Stream {
  constructor(port, p, body, { headers = {}, timeout = 120000 * SLOW } = {}) {
    this.events = []; // {raw: Buffer, data: string, json, t: arrival in ms}
    this.brokenUtf8 = [];
    this.bad = []; // events that are not `data: ...`
    this.doneSeen = false;
    this.afterDone = 0;
    this.status = undefined;
    this.headers = undefined;
    this.text = '';
    this.closed = false;
    this.waiters = [];
    const data = JSON.stringify(body);
    this.req = http.request({
      host: '127.0.0.1', port, method: 'POST', path: p, agent: false, timeout,
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(data), ...headers },
    });
    this.finished = new Promise((resolve, reject) => {
      this.req.on('response', (res) => {
        this.status = res.statusCode;
        this.headers = res.headers;
        this.wake();
        let pending = Buffer.alloc(0);
        const all = [];
        res.on('data', (d) => {
          all.push(d);
          if (this.status !== 200) return;
          pending = Buffer.concat([pending, d]);
          for (let i; (i = pending.indexOf('\n\n')) >= 0;) {
            this.#event(pending.subarray(0, i));
            pending = pending.subarray(i + 2);
          }
        });
        const end = () => {
          if (this.closed) return;
          this.closed = true;
          this.text = Buffer.concat(all).toString('utf8');
          try {
            this.json = JSON.parse(this.text);
          } catch {}
          if (pending.length && this.status === 200) this.bad.push(`unterminated event ${fmt(pending.toString())}`);
          this.wake();
          resolve(this);
        };
        res.on('end', end);
        res.on('close', end);
        res.on('error', () => end());
      });
      this.req.on('timeout', () => this.req.destroy(new Error(`POST ${p} (stream): stalled for ${timeout} ms`)));
      this.req.on('error', (e) => {
        if (this.aborted) return resolve(this);
        reject(e);
      });
    });
    this.finished.catch(() => {}); // awaited by the test; no unhandled rejection
    this.req.end(data);
  }

  #event(raw) {
    let s;
    try {
      s = fatalUtf8().decode(raw);
    } catch {
      this.brokenUtf8.push(raw.toString('hex'));
      s = raw.toString('utf8');
    }
    if (this.doneSeen) this.afterDone++;
    if (!s.startsWith('data: ')) {
      this.bad.push(s);
    } else if (s === 'data: [DONE]') {
      this.doneSeen = true;
    } else {
      let json;
      try {
        json = JSON.parse(s.slice(6));
      } catch {
        this.bad.push(s);
      }
      this.events.push({ raw, data: s.slice(6), json, t: Date.now() });
    }
    this.wake();
  }

  wake() {
    for (const w of this.waiters.splice(0)) w();
  }
  /* Resolves once pred() holds (checked at every event), or the stream ended. */
  async until(pred, what = 'condition', ms = 60000 * SLOW) {
    const limit = Date.now() + ms;
    while (!pred()) {
      if (this.closed) fail(`stream ended before ${what}; status ${this.status}, ${this.events.length} events, body ${fmt(this.text.slice(0, 300))}`);
      if (Date.now() > limit) fail(`stream: no ${what} in ${ms} ms`);
      await new Promise((r) => {
        this.waiters.push(r);
        setTimeout(r, 50);
      });
    }
  }
  /* Drops the connection (a client that goes away mid-stream). */
  destroy() {
    this.aborted = true;
    this.req.destroy();
  }
}

/* A finished 200 stream's chunks, checked against the spec: one id and
 * object for all chunks, deltas (chat: the first with role "assistant"),
 * one finish_reason per choice on its last content chunk, the usage chunk
 * (choices []) last when asked, then data: [DONE] and nothing after.
 * Returns {texts: [per choice], finish: [per choice], usage, chunks}. */
export function checkStream(st, { chat, includeUsage = false, n = 1 }, what) {
  if (st.status !== 200) fail(`${what}: expected HTTP 200, got ${st.status} ${st.text.slice(0, 400)}`);
  ok(/^text\/event-stream/.test(st.headers['content-type'] || ''), `${what}: expected Content-Type text/event-stream`, st.headers['content-type']);
  eq(st.brokenUtf8, [], `${what}: chunks whose bytes are not whole UTF-8 (hex)`);
  eq(st.bad, [], `${what}: events that are not data: JSON`);
  ok(st.doneSeen, `${what}: no data: [DONE]`);
  eq(st.afterDone, 0, `${what}: events after [DONE]`);
  const object = chat ? 'chat.completion.chunk' : 'text_completion';
  const texts = Array(n).fill(''), finish = Array(n).fill(null), roleSeen = Array(n).fill(false);
  let usage = null, id = null, k = 0;
  for (const { json: c } of st.events) {
    const at = `${what}: chunk ${k++}`;
    ok(c && typeof c === 'object', `${at}: expected a JSON object`, c);
    eq(c.object, object, `${at}: object`);
    type(c.id, 'string', `${at}: id`);
    if (id === null) id = c.id;
    eq(c.id, id, `${at}: id (same in every chunk)`);
    isInt(c.created, `${at}: created`);
    eq(c.model, MODEL_NAME, `${at}: model`);
    ok(Array.isArray(c.choices), `${at}: choices is not an array`, c);
    if (usage) fail(`${at}: a chunk after the usage chunk`);
    if (c.choices.length === 0) {
      ok(includeUsage, `${at}: a chunk with no choices though include_usage was not asked`, c);
      usage = c.usage;
      ok(usage && typeof usage === 'object', `${at}: the choices [] chunk has no usage`, c);
      continue;
    }
    if (!includeUsage) ok(c.usage == null, `${at}: usage without include_usage`, c.usage);
    for (const ch of c.choices) {
      between(ch.index, 0, n - 1, `${at}: choices[].index`);
      const i = ch.index;
      if (finish[i] !== null) fail(`${at}: choice ${i} has a chunk after its finish_reason`);
      let piece;
      if (chat) {
        ok(ch.delta && typeof ch.delta === 'object', `${at}: no delta`, ch);
        if (!roleSeen[i]) eq(ch.delta.role, 'assistant', `${at}: the first delta's role`);
        roleSeen[i] = true;
        piece = ch.delta.content ?? '';
      } else {
        piece = ch.text;
      }
      type(piece, 'string', `${at}: content`);
      ok(!LONE_SURROGATE.test(piece), `${at}: content has a lone surrogate`, piece);
      texts[i] += piece;
      if (ch.finish_reason != null) {
        ok(['stop', 'length'].includes(ch.finish_reason), `${at}: finish_reason`, ch.finish_reason);
        finish[i] = ch.finish_reason;
      }
    }
  }
  for (let i = 0; i < n; i++) ok(finish[i] !== null, `${what}: choice ${i} never got a finish_reason`);
  if (includeUsage) {
    ok(usage, `${what}: no usage chunk with include_usage`);
    checkUsage(usage, `${what}: usage`);
  }
  return { texts, text: texts[0], finish, usage, chunks: st.events.length };
}

export function checkUsage(u, what) {
  ok(u && typeof u === 'object', `${what}: not an object`, u);
  for (const k of ['prompt_tokens', 'completion_tokens', 'total_tokens']) isInt(u[k], `${what}.${k}`);
  eq(u.total_tokens, u.prompt_tokens + u.completion_tokens, `${what}.total_tokens (prompt + completion)`);
  ok(u.prompt_tokens_details && typeof u.prompt_tokens_details === 'object', `${what}.prompt_tokens_details missing`, u);
  isInt(u.prompt_tokens_details.cached_tokens, `${what}.prompt_tokens_details.cached_tokens`);
  between(u.prompt_tokens_details.cached_tokens, 0, u.prompt_tokens, `${what}.prompt_tokens_details.cached_tokens`);
}

/* A raw TCP connection: sends `data`, resolves with the seconds until the
 * server closed it (null: still open after ms). */
export function idleConnection(port, data, ms) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const sock = net.connect(port, '127.0.0.1', () => data && sock.write(data));
    const t = setTimeout(() => {
      resolve(null);
      sock.destroy();
    }, ms);
    sock.on('data', () => {});
    sock.on('error', () => {});
    sock.on('close', () => {
      clearTimeout(t);
      resolve((Date.now() - t0) / 1000);
    });
  });
}

// ---- expected outputs from the CLI ---------------------------------------------

/* `ringlm ARGS` -> stdout (rejects on a non-zero exit). */
export function cli(args, { timeout = 120000 * SLOW } = {}) {
  return new Promise((resolve, reject) =>
    execFile(BIN, args, { timeout, maxBuffer: 64 << 20, encoding: 'buffer' }, (e, stdout, stderr) => {
      if (e) reject(new CheckError(`ringlm ${args.join(' ')}: ${e.message}\n${stderr}`));
      else resolve({ stdout: stdout.toString('utf8'), stderr: stderr.toString('utf8'), raw: stdout });
    }));
}

/* The text `ringlm run -p TEXT ARGS --no-display-prompt` generates: stdout
 * is the generated text and one newline; the stats line is on stderr. */
export async function runText(prompt, args) {
  const { stdout } = await cli(['run', '-p', prompt, '--no-display-prompt', ...args]);
  ok(stdout.endsWith('\n'), `ringlm run: expected stdout to end in a newline`, stdout);
  return stdout.slice(0, -1);
}

/* The ids `ringlm tokenize -p TEXT` prints (space-separated, one line). */
export async function tokenizeCli(text, extra = []) {
  const { stdout } = await cli(['tokenize', '-p', text, ...extra]);
  return stdout.trim().split(/\s+/).filter(Boolean).map(Number);
}

/* Runs jobs (functions returning promises) with at most `width` at once;
 * the results in order. */
export async function limited(jobs, width) {
  const out = Array(jobs.length);
  let next = 0;
  await Promise.all(Array.from({ length: width }, async () => {
    while (next < jobs.length) {
      const i = next++;
      out[i] = await jobs[i]();
    }
  }));
  return out;
}

// ---- Prometheus text ------------------------------------------------------------

/* {samples: Map("name{labels}" -> number), help: Set(name), types: Map(name -> type)}.
 * Fails on a line that is neither a comment nor `name[{labels}] number`. */
export function parseMetrics(text) {
  const samples = new Map(), help = new Set(), types = new Map();
  for (const line of text.split('\n')) {
    if (!line.trim()) continue;
    let m;
    if ((m = /^# HELP (\S+) \S/.exec(line))) help.add(m[1]);
    else if ((m = /^# TYPE (\S+) (counter|gauge|histogram|summary|untyped)$/.exec(line))) types.set(m[1], m[2]);
    else if (line.startsWith('#')) continue;
    else if ((m = /^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)(?: \d+)?$/.exec(line))) {
      const v = Number(m[2].replace(/^\+Inf$/, 'Infinity'));
      ok(!Number.isNaN(v) || m[2] === 'NaN', `/metrics: bad value in ${fmt(line)}`);
      samples.set(m[1], v);
    } else fail(`/metrics: not Prometheus text: ${fmt(line)}`);
  }
  return { samples, help, types, get: (k) => samples.get(k) };
}
