// server_http: every route, status code and error of `ringlm serve` with
// raw HTTP (node:http, node:net); expected texts come from `ringlm run`,
// `ringlm tokenize` or another request, never from this file.
import fs from 'node:fs';
import path from 'node:path';
import { execFile } from 'node:child_process';
import http from 'node:http';
import {
  BIN, MODEL_DIR, MODEL_NAME, SLOW, Server, between, checkStream, checkUsage, cli, eq, errorBody,
  idleConnection, isInt, main, ok, runText, status, test, tokenizeCli, type, waitFor, withServer,
} from './lib.mjs';

const P = 'The jury said that';
const greedy = { temperature: 0, ignore_eos: true };

// One server with the defaults serves most cases; the ones that need
// other options start their own.
let S;
test('startup', async () => {
  S = await Server.start([]);
  ok(S.line.includes(MODEL_NAME), 'startup line: expected the model name', S.line);
  ok(/\bKV\b/.test(S.line), 'startup line: expected the KV settings', S.line);
  // Bound to 127.0.0.1 only by default: one listening socket (state 0A)
  // on the port, local address 0100007F in /proc/net/tcp, none in tcp6.
  const port = S.port.toString(16).toUpperCase().padStart(4, '0');
  const listening = (file) => {
    let text = '';
    try {
      text = fs.readFileSync(file, 'utf8');
    } catch {}
    return text.split('\n').slice(1).map((l) => l.trim().split(/\s+/))
      .filter((f) => f[3] === '0A' && f[1] && f[1].endsWith(`:${port}`)).map((f) => f[1]);
  };
  eq(listening('/proc/net/tcp'), [`0100007F:${port}`], `listening sockets on port ${S.port} (hex address:port in /proc/net/tcp)`);
  eq(listening('/proc/net/tcp6'), [], `IPv6 listening sockets on port ${S.port} (/proc/net/tcp6)`);
});

test('bad options exit 2 with one line on stderr', async () => {
  const cases = [
    ['--port', '70000'],
    ['--port', '0', '--parallel', '0'],
    ['--port', '0', '--memory-budget', '5Q'],
    ['--port', '0', '--queue', 'x'],
    ['--port', '0', '--temp', 'hot'],
    ['--port', '0', '--no-such-option'],
  ];
  for (const args of cases) {
    const r = await new Promise((resolve) =>
      execFile(BIN, ['serve', ...args], { timeout: 20000 * SLOW }, (e, stdout, stderr) =>
        resolve({ code: e ? e.code : 0, signal: e && e.signal, stdout, stderr })));
    const what = `ringlm serve ${args.join(' ')}`;
    eq(r.code, 2, `${what}: exit status`);
    const lines = r.stderr.trimEnd().split('\n');
    ok(lines.length === 1 && lines[0].length > 0, `${what}: expected one line on stderr`, r.stderr);
    eq(r.stdout, '', `${what}: stdout`);
  }
});

test('GET /health, /v1/models', async () => {
  const h = await S.health();
  eq(h.status, 'ok', '/health status');
  eq(h.model, MODEL_NAME, '/health model');
  for (const k of ['rows_busy', 'rows_free', 'queue', 'memory_budget', 'memory_used', 'weights_bytes'])
    isInt(h[k], `/health ${k}`);
  eq([h.rows_busy, h.rows_free, h.queue], [0, 4, 0], '/health [rows_busy, rows_free, queue] idle with 4 rows (the default)');
  eq(h.memory_budget, 0, '/health memory_budget without --memory-budget');
  const file = fs.statSync(path.join(MODEL_DIR, 'model.safetensors')).size;
  between(h.weights_bytes, file / 4, file * 4, `/health weights_bytes (model.safetensors is ${file} bytes)`);
  ok(h.memory_used >= 0, '/health memory_used', h.memory_used);

  const m = jsonOk(await S.get('/v1/models'), 'GET /v1/models');
  eq(m.object, 'list', '/v1/models object');
  eq(m.data.length, 1, '/v1/models data length');
  const d = m.data[0];
  eq([d.id, d.object, d.owned_by], [MODEL_NAME, 'model', 'ringlm'], '/v1/models data[0] [id, object, owned_by]');
  isInt(d.created, '/v1/models created');
});

test('GET /metrics is Prometheus text', async () => {
  const r = await S.get('/metrics');
  status(r, 200, 'GET /metrics');
  const ct = r.headers['content-type'] || '';
  ok(/^text\/plain/.test(ct) && /version=0\.0\.4/.test(ct), 'GET /metrics Content-Type: expected text/plain; version=0.0.4', ct);
  const m = await S.metrics();
  for (const name of ['ringlm_requests_total', 'ringlm_prompt_tokens_total', 'ringlm_generated_tokens_total',
    'ringlm_prompt_cache_hit_tokens_total', 'ringlm_queue_depth', 'ringlm_kv_bytes',
    'ringlm_decode_tokens_per_second', 'ringlm_rows_busy']) {
    ok(m.help.has(name), `/metrics: no # HELP ${name}`);
    ok(m.types.has(name), `/metrics: no # TYPE ${name}`);
    if (name.endsWith('_total')) eq(m.types.get(name), 'counter', `/metrics: # TYPE of ${name}`);
    if (name !== 'ringlm_requests_total') ok(m.samples.has(name), `/metrics: no sample ${name}`);
  }
  eq([m.get('ringlm_queue_depth'), m.get('ringlm_rows_busy')], [0, 0], '/metrics [queue_depth, rows_busy] idle');
});

/* A 200 JSON answer. */
function jsonOk(r, what) {
  const c = status(r, 200, what);
  ok(/^application\/json/.test(r.headers['content-type'] || ''), `${what}: Content-Type`, r.headers['content-type']);
  return c;
}

/* A non-stream completion checked field by field. */
async function completion(body, what) {
  const c = jsonOk(await S.post('/v1/completions', body), what);
  ok(/^cmpl-/.test(c.id), `${what}: id: expected cmpl-...`, c.id);
  eq(c.object, 'text_completion', `${what}: object`);
  between(c.created, Date.now() / 1000 - 86400, Date.now() / 1000 + 86400, `${what}: created (unix seconds)`);
  eq(c.model, MODEL_NAME, `${what}: model`);
  eq(c.choices.length, body.n ?? 1, `${what}: choices length`);
  c.choices.forEach((ch, i) => {
    eq(ch.index, i, `${what}: choices[${i}].index`);
    type(ch.text, 'string', `${what}: choices[${i}].text`);
    ok(['stop', 'length'].includes(ch.finish_reason), `${what}: choices[${i}].finish_reason`, ch.finish_reason);
    ok('logprobs' in ch, `${what}: choices[${i}].logprobs missing`);
  });
  checkUsage(c.usage, `${what}: usage`);
  return c;
}

async function chat(body, what) {
  const c = jsonOk(await S.post('/v1/chat/completions', body), what);
  type(c.id, 'string', `${what}: id`);
  eq(c.object, 'chat.completion', `${what}: object`);
  isInt(c.created, `${what}: created`);
  eq(c.model, MODEL_NAME, `${what}: model`);
  eq(c.choices.length, body.n ?? 1, `${what}: choices length`);
  c.choices.forEach((ch, i) => {
    eq(ch.index, i, `${what}: choices[${i}].index`);
    eq(ch.message && ch.message.role, 'assistant', `${what}: choices[${i}].message.role`);
    type(ch.message.content, 'string', `${what}: choices[${i}].message.content`);
    ok(['stop', 'length'].includes(ch.finish_reason), `${what}: choices[${i}].finish_reason`, ch.finish_reason);
  });
  checkUsage(c.usage, `${what}: usage`);
  return c;
}

test('POST /v1/completions: text and token-id prompts = ringlm run', async () => {
  const want = await runText(P, ['-n', '8', '--temp', '0', '--ignore-eos']);
  const ids = await tokenizeCli(P);
  const c = await completion({ prompt: P, max_tokens: 8, ...greedy }, 'completion of a string');
  eq(c.choices[0].text, want, 'completion text vs ringlm run -p');
  eq(c.choices[0].finish_reason, 'length', 'finish_reason at max_tokens');
  eq(c.choices[0].logprobs, null, 'logprobs when not asked');
  eq([c.usage.prompt_tokens, c.usage.completion_tokens], [ids.length, 8], 'usage [prompt_tokens (ringlm tokenize), completion_tokens]');
  const c2 = await completion({ prompt: ids, max_tokens: 8, ...greedy }, 'completion of token ids');
  eq(c2.choices[0].text, want, 'completion of the ids vs ringlm run -p');
  eq(c2.usage.prompt_tokens, ids.length, 'usage.prompt_tokens of an id prompt');
  // max_completion_tokens works as max_tokens; unknown fields are ignored.
  const c3 = await completion({ prompt: P, max_completion_tokens: 3, temperature: 0, ignore_eos: true, foo: { bar: [1] }, user: 'u' },
    'completion with max_completion_tokens and unknown fields');
  eq(c3.usage.completion_tokens, 3, 'completion_tokens with max_completion_tokens 3');
  ok(want.startsWith(c3.choices[0].text), 'the 3-token greedy text is a prefix of the 8-token one', [c3.choices[0].text, want]);
});

test('POST /v1/chat/completions = ringlm run --chat', async () => {
  const U = 'Tell me about the weather in the city.';
  const want = await runText(U, ['--chat', '-n', '8', '--temp', '0', '--ignore-eos']);
  const c = await chat({ messages: [{ role: 'user', content: U }], max_tokens: 8, ...greedy }, 'chat');
  eq(c.choices[0].message.content, want, 'chat content vs ringlm run --chat');
  eq(c.choices[0].finish_reason, 'length', 'chat finish_reason at max_tokens');
  eq(c.usage.completion_tokens, 8, 'chat usage.completion_tokens');
  const raw = await tokenizeCli(U);
  ok(c.usage.prompt_tokens > raw.length, `chat usage.prompt_tokens: expected more than the ${raw.length} of the bare text (the template)`, c.usage.prompt_tokens);
  const c2 = await chat({ messages: [{ role: 'user', content: U }], max_completion_tokens: 5, ...greedy }, 'chat max_completion_tokens');
  eq(c2.usage.completion_tokens, 5, 'chat completion_tokens with max_completion_tokens 5');
  ok(want.startsWith(c2.choices[0].message.content), 'the 5-token chat reply is a prefix of the 8-token one', [c2.choices[0].message.content, want]);
  const sys = 'You are a reporter for a small newspaper.';
  const wantSys = await runText(U, ['--chat', '--system', sys, '-n', '8', '--temp', '0', '--ignore-eos']);
  const c3 = await chat({ messages: [{ role: 'system', content: sys }, { role: 'user', content: U }], max_tokens: 8, ...greedy }, 'chat with a system message');
  eq(c3.choices[0].message.content, wantSys, 'chat with a system message vs ringlm run --chat --system');
  ok(c3.usage.prompt_tokens > c.usage.prompt_tokens, 'prompt_tokens with a system message: expected more than without', [c3.usage.prompt_tokens, c.usage.prompt_tokens]);
});

test('keep-alive: requests one after another on one connection', async () => {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const ports = [];
  try {
    for (const [m, p, body] of [['GET', '/health'], ['POST', '/v1/completions', { prompt: P, max_tokens: 2, ...greedy }],
      ['POST', '/v1/completions', { prompt: 'x', top_p: 9 }], ['GET', '/v1/models'],
      ['POST', '/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], max_tokens: 2 }], ['GET', '/metrics']]) {
      const r = await S.request(m, p, { body, agent });
      ok(r.status === 200 || r.status === 400, `${m} ${p} on a kept-alive connection: status`, r.status);
      ports.push(r.socket);
    }
  } finally {
    agent.destroy();
  }
  eq(new Set(ports).size, 1, `local ports of the requests (one connection kept alive): ${ports}`);
});

test('stream = non-stream (completions and chat, include_usage)', async () => {
  const body = { prompt: P, max_tokens: 12, ...greedy };
  const whole = await completion(body, 'completion');
  const st = await S.stream('/v1/completions', { ...body, stream: true, stream_options: { include_usage: true } }).finished;
  const got = checkStream(st, { chat: false, includeUsage: true }, 'completion stream');
  eq(got.text, whole.choices[0].text, 'streamed completion text vs non-stream');
  eq(got.finish[0], 'length', 'streamed finish_reason');
  eq([got.usage.prompt_tokens, got.usage.completion_tokens], [whole.usage.prompt_tokens, 12], 'stream usage vs non-stream');

  const cb = { messages: [{ role: 'user', content: 'Where did they go?' }], max_tokens: 12, ...greedy };
  const cw = await chat(cb, 'chat');
  const cs = await S.stream('/v1/chat/completions', { ...cb, stream: true }).finished;
  const cg = checkStream(cs, { chat: true }, 'chat stream');
  eq(cg.text, cw.choices[0].message.content, 'streamed chat content vs non-stream');
  ok(cg.chunks >= 2, 'chat stream: expected a chunk per piece', cg.chunks);
});

test('stop strings', async () => {
  const P2 = 'She looked at him and';
  const T = (await completion({ prompt: P2, max_tokens: 16, ...greedy }, 'completion')).choices[0].text;
  ok(T.length >= 8, 'the 16-token text is too short to cut', T);
  const s = T.slice(Math.floor(T.length / 2), Math.floor(T.length / 2) + 3);
  const want = T.slice(0, T.indexOf(s));
  // A stop string of several tokens: the stream must hold back its start.
  const s2 = T.slice(Math.floor(T.length / 3), Math.floor(T.length / 3) + 9);
  const want2 = T.slice(0, T.indexOf(s2));
  const st2 = await S.stream('/v1/completions', { prompt: P2, max_tokens: 16, stop: s2, stream: true, ...greedy }).finished;
  eq(checkStream(st2, { chat: false }, 'stream with a longer stop string').text, want2, `streamed text with stop ${JSON.stringify(s2)}`);
  for (const stop of [s, ['\u0001never', s]]) {
    const c = await completion({ prompt: P2, max_tokens: 16, stop, ...greedy }, `completion with stop ${JSON.stringify(stop)}`);
    eq(c.choices[0].text, want, `text with stop ${JSON.stringify(stop)} (the 16-token text ${JSON.stringify(T)} cut before it)`);
    eq(c.choices[0].finish_reason, 'stop', 'finish_reason at a stop string');
    ok(c.usage.completion_tokens < 16, 'completion_tokens with a stop string', c.usage.completion_tokens);
  }
  const st = await S.stream('/v1/completions', { prompt: P2, max_tokens: 16, stop: [s], stream: true, ...greedy }).finished;
  const g = checkStream(st, { chat: false }, 'stream with a stop string');
  eq(g.text, want, 'streamed text with a stop string');
  eq(g.finish[0], 'stop', 'streamed finish_reason at a stop string');
});

test('n choices', async () => {
  const c = await completion({ prompt: P, max_tokens: 6, n: 4, ...greedy }, 'completion n 4');
  const one = await completion({ prompt: P, max_tokens: 6, ...greedy }, 'completion n 1');
  eq(c.choices.map((x) => x.text), Array(4).fill(one.choices[0].text), 'greedy n 4 texts');
  const seeded = await completion({ prompt: P, max_tokens: 16, n: 4, seed: 5, temperature: 1, ignore_eos: true }, 'sampled n 4');
  ok(new Set(seeded.choices.map((x) => x.text)).size >= 2, 'sampled n 4 (temperature 1): expected different choices', seeded.choices.map((x) => x.text));
  const cb = { messages: [{ role: 'user', content: 'Go on.' }], max_tokens: 6, n: 2, ...greedy };
  const cw = await chat(cb, 'chat n 2');
  const st = await S.stream('/v1/chat/completions', { ...cb, stream: true }).finished;
  const g = checkStream(st, { chat: true, n: 2 }, 'chat stream n 2');
  eq(g.texts, cw.choices.map((x) => x.message.content), 'streamed n 2 contents vs non-stream');
});

test('seeded sampling repeats; sampling fields accepted', async () => {
  const body = { prompt: 'It was', max_tokens: 16, seed: 1234, top_p: 0.9, top_k: 40, min_p: 0.02, ignore_eos: true };
  const a = await completion(body, 'seeded completion');
  const b = await completion(body, 'seeded completion again');
  eq(b.choices[0].text, a.choices[0].text, 'the same seed twice (temperature 1 by default)');
  const st = await S.stream('/v1/completions', { ...body, stream: true }).finished;
  eq(checkStream(st, { chat: false }, 'seeded stream').text, a.choices[0].text, 'seeded stream vs non-stream');
});

test('temperature defaults to 1 (OpenAI): seeds give different texts; greedy ones do not', async () => {
  const texts = async (extra) => {
    const out = [];
    for (const seed of [1, 2, 3, 4])
      out.push((await completion({ prompt: 'It was', max_tokens: 16, seed, ignore_eos: true, ...extra }, `seed ${seed}`)).choices[0].text);
    return out;
  };
  const dflt = await texts({});
  ok(new Set(dflt).size >= 2, 'four seeds without a temperature field: expected sampled (different) texts, as temperature 1', dflt);
  const zero = await texts({ temperature: 0 });
  eq(new Set(zero).size, 1, `four seeds at temperature 0: distinct texts (${JSON.stringify(zero)})`);
});

test('penalties change a repetitive greedy text; repetition_penalty = ringlm run --repeat-penalty', async () => {
  const P3 = 'It was the first time';
  const base = (await completion({ prompt: P3, max_tokens: 32, ...greedy }, 'greedy')).choices[0].text;
  const words = base.split(/\s+/).filter(Boolean);
  ok(new Set(words).size < words.length, 'the greedy text repeats no word, so no penalty can show', base);
  for (const f of [{ frequency_penalty: 2 }, { presence_penalty: 2 }]) {
    const t = (await completion({ prompt: P3, max_tokens: 32, ...greedy, ...f }, JSON.stringify(f))).choices[0].text;
    ok(t !== base, `${JSON.stringify(f)}: expected a text other than the unpenalized ${JSON.stringify(base)}`, t);
  }
  const want = await runText(P3, ['-n', '32', '--temp', '0', '--ignore-eos', '--repeat-penalty', '1.5']);
  ok(want !== base, 'ringlm run --repeat-penalty 1.5 gives the unpenalized text', want);
  const t = (await completion({ prompt: P3, max_tokens: 32, ...greedy, repetition_penalty: 1.5 }, 'repetition_penalty')).choices[0].text;
  eq(t, want, 'repetition_penalty 1.5 vs ringlm run --repeat-penalty 1.5');
});

test('logprobs (chat and completions)', async () => {
  const cb = { messages: [{ role: 'user', content: 'Say something.' }], max_tokens: 6, ...greedy };
  const none = await chat(cb, 'chat without logprobs');
  ok(none.choices[0].logprobs == null, 'chat logprobs when not asked: expected null', none.choices[0].logprobs);
  const c = await chat({ ...cb, logprobs: true, top_logprobs: 3 }, 'chat logprobs');
  eq(c.choices[0].message.content, none.choices[0].message.content, 'chat content with logprobs vs without');
  const lp = c.choices[0].logprobs && c.choices[0].logprobs.content;
  ok(Array.isArray(lp), 'chat logprobs.content: expected an array', c.choices[0].logprobs);
  eq(lp.length, c.usage.completion_tokens, 'chat logprobs.content length vs completion_tokens');
  lp.forEach((e, i) => {
    type(e.token, 'string', `logprobs.content[${i}].token`);
    ok(typeof e.logprob === 'number' && e.logprob <= 1e-6, `logprobs.content[${i}].logprob: expected <= 0`, e.logprob);
    ok(Array.isArray(e.top_logprobs) && e.top_logprobs.length === 3, `logprobs.content[${i}].top_logprobs: expected 3`, e.top_logprobs);
    const tops = e.top_logprobs.map((x) => x.logprob);
    ok(tops.every((v, j) => j === 0 || v <= tops[j - 1] + 1e-6), `logprobs.content[${i}].top_logprobs: expected most likely first`, tops);
    ok(Math.abs(e.logprob - tops[0]) < 1e-3 && e.token === e.top_logprobs[0].token,
      `logprobs.content[${i}]: greedy picks the most likely token`, e);
  });
  eq(lp.map((e) => e.token).join(''), c.choices[0].message.content, 'chat logprobs tokens joined vs content');
  const c0 = await chat({ ...cb, logprobs: true, top_logprobs: 0 }, 'chat logprobs, top_logprobs 0');
  eq(c0.choices[0].logprobs.content.map((e) => e.top_logprobs.length), Array(c0.usage.completion_tokens).fill(0), 'top_logprobs lengths with top_logprobs 0');

  const k = await completion({ prompt: P, max_tokens: 5, logprobs: 2, ...greedy }, 'completion logprobs 2');
  const kl = k.choices[0].logprobs;
  ok(kl && typeof kl === 'object', 'completion logprobs: expected an object', kl);
  if (Array.isArray(kl.tokens)) {
    eq(kl.tokens.length, 5, 'completion logprobs.tokens length');
    eq(kl.tokens.join(''), k.choices[0].text, 'completion logprobs.tokens joined vs text');
    ok(kl.token_logprobs.every((v) => v <= 1e-6), 'completion token_logprobs: expected <= 0', kl.token_logprobs);
    ok(kl.top_logprobs.every((o) => Object.keys(o).length === 2 || Object.keys(o).length === 1), 'completion top_logprobs: expected 2 entries each', kl.top_logprobs);
  }
});

test('400 invalid_request_error naming the field', async () => {
  const msgs = [{ role: 'user', content: 'x' }];
  const cases = [
    ['/v1/completions', '{"prompt": "x", ', null, 'malformed JSON'],
    ['/v1/chat/completions', '[1, 2', null, 'malformed JSON'],
    ['/v1/completions', Buffer.from('{"prompt": "\xff\xfe", "max_tokens": 1}', 'latin1'), null, 'invalid UTF-8'],
    ['/v1/completions', { prompt: 'x', temperature: 'hot' }, 'temperature'],
    ['/v1/completions', { prompt: 'x', top_p: 2 }, 'top_p'],
    ['/v1/completions', { prompt: 'x', max_tokens: -1 }, 'max_tokens'],
    ['/v1/completions', { prompt: 'x', max_tokens: 'many' }, 'max_tokens'],
    ['/v1/completions', { prompt: 'x', n: 5 }, 'n'],
    ['/v1/completions', { prompt: 'x', stop: ['a', 'b', 'c', 'd', 'e'] }, 'stop'],
    ['/v1/completions', { prompt: 'x', stop: 7 }, 'stop'],
    ['/v1/completions', { prompt: 'x', presence_penalty: 3 }, 'presence_penalty'],
    ['/v1/completions', { prompt: 'x', frequency_penalty: -2.5 }, 'frequency_penalty'],
    ['/v1/completions', { prompt: 'x', logprobs: 6 }, 'logprobs'],
    ['/v1/completions', { prompt: 'x', stream: 'yes' }, 'stream'],
    ['/v1/completions', { prompt: [1, 'a'] }, 'prompt'],
    ['/v1/completions', { prompt: [1, 99999999] }, 'prompt'],
    ['/v1/completions', { max_tokens: 2 }, 'prompt'],
    ['/v1/chat/completions', { max_tokens: 2 }, 'messages'],
    ['/v1/chat/completions', { messages: 'hello' }, 'messages'],
    ['/v1/chat/completions', { messages: msgs, top_logprobs: 21, logprobs: true }, 'top_logprobs'],
    ['/v1/chat/completions', { messages: msgs, temperature: -1 }, 'temperature'],
    ['/v1/chat/completions', { messages: msgs, n: 0 }, 'n'],
    ['/tokenize', { add_special: true }, 'content'],
    ['/detokenize', { tokens: ['a'] }, 'tokens'],
  ];
  for (const [route, body, param, label] of cases) {
    const raw = typeof body === 'string' || Buffer.isBuffer(body);
    const r = await S.post(route, body, raw ? { headers: { 'Content-Type': 'application/json' } } : {});
    errorBody(r, 400, `POST ${route} ${label || JSON.stringify(body)}`, { type: 'invalid_request_error', param });
  }
  // The server still answers.
  await completion({ prompt: 'x', max_tokens: 1 }, 'a completion after the errors');
});

test('404 unknown route, 405 wrong method with Allow', async () => {
  for (const [m, p] of [['GET', '/nope'], ['POST', '/v1/nothing'], ['GET', '/v1/completions/x']])
    errorBody(await S.request(m, p), 404, `${m} ${p}`);
  for (const [m, p, allow] of [['GET', '/v1/completions', 'POST'], ['GET', '/v1/chat/completions', 'POST'],
    ['POST', '/health', 'GET'], ['PUT', '/v1/models', 'GET'], ['DELETE', '/metrics', 'GET'], ['GET', '/tokenize', 'POST'],
    ['GET', '/detokenize', 'POST']]) {
    const r = await S.request(m, p);
    errorBody(r, 405, `${m} ${p}`);
    ok((r.headers.allow || '').toUpperCase().includes(allow), `${m} ${p}: expected an Allow header with ${allow}`, r.headers.allow);
  }
});

test('POST /tokenize and /detokenize = ringlm tokenize', async () => {
  for (const text of ['The jury said, "It is over."', 'naïve café — 日本語 ü\n\ttabs  and  spaces']) {
    const want = await tokenizeCli(text);
    const bare = await tokenizeCli(text, ['--no-special']);
    eq(status(await S.post('/tokenize', { content: text }), 200, '/tokenize').tokens, want, `/tokenize ${JSON.stringify(text)} vs ringlm tokenize`);
    eq(status(await S.post('/tokenize', { content: text, add_special: true }), 200, '/tokenize').tokens, want, '/tokenize add_special true');
    eq(status(await S.post('/tokenize', { content: text, add_special: false }), 200, '/tokenize').tokens, bare,
      `/tokenize add_special false vs ringlm tokenize --no-special`);
    eq(status(await S.post('/detokenize', { tokens: bare }), 200, '/detokenize').content, text, '/detokenize of /tokenize (round trip)');
    const full = status(await S.post('/detokenize', { tokens: want }), 200, '/detokenize').content;
    ok(full.endsWith(text), '/detokenize of the ids with BOS: expected the text at the end', full);
  }
});

test('metrics counters follow the requests', async () => {
  const m0 = await S.metrics();
  const us = [];
  for (const prompt of ['A new prompt for the counters', 'Another one, quite different']) {
    const c = await completion({ prompt, max_tokens: 4, ...greedy }, 'completion');
    us.push(c.usage);
  }
  await S.get('/no-such-route');
  await S.post('/v1/completions', { prompt: 'x', top_p: 5 });
  const m1 = await S.metrics();
  const d = (k) => (m1.get(k) ?? 0) - (m0.get(k) ?? 0);
  const sum = (f) => us.reduce((a, u) => a + f(u), 0);
  ok(d('ringlm_requests_total{status="200"}') >= 2, 'requests_total{status="200"}: expected +2 or more', d('ringlm_requests_total{status="200"}'));
  ok(d('ringlm_requests_total{status="400"}') >= 1, 'requests_total{status="400"}: expected +1', d('ringlm_requests_total{status="400"}'));
  ok(d('ringlm_requests_total{status="404"}') >= 1, 'requests_total{status="404"}: expected +1', d('ringlm_requests_total{status="404"}'));
  eq(d('ringlm_generated_tokens_total'), sum((u) => u.completion_tokens), 'generated_tokens_total increase vs the completion_tokens');
  between(d('ringlm_prompt_tokens_total'), sum((u) => u.prompt_tokens - u.prompt_tokens_details.cached_tokens), sum((u) => u.prompt_tokens),
    'prompt_tokens_total increase (the prompt_tokens, less or with the cached ones)');
  eq(d('ringlm_prompt_cache_hit_tokens_total'), sum((u) => u.prompt_tokens_details.cached_tokens), 'prompt_cache_hit_tokens_total increase vs cached_tokens');
  ok(m1.get('ringlm_decode_tokens_per_second') >= 0 && m1.get('ringlm_kv_bytes') >= 0, 'decode_tokens_per_second and kv_bytes: expected >= 0',
    [m1.get('ringlm_decode_tokens_per_second'), m1.get('ringlm_kv_bytes')]);
});

test('a stream never splits a UTF-8 character (temperature 1.5)', async () => {
  // The byte-level vocabulary has byte tokens; sampled hot, some come out.
  let nonAscii = 0;
  for (const seed of [1, 2, 3]) {
    const body = { prompt: 'Caf\u00e9 na\u00efve \u65e5\u672c', max_tokens: 128, temperature: 1.5, seed, ignore_eos: true };
    const st = await S.stream('/v1/completions', { ...body, stream: true }).finished;
    const g = checkStream(st, { chat: false }, `hot stream seed ${seed}`);
    const whole = await completion(body, `hot completion seed ${seed}`);
    eq(g.text, whole.choices[0].text, `hot stream seed ${seed} vs non-stream`);
    nonAscii += [...g.text].filter((ch) => ch.codePointAt(0) > 127).length;
  }
  console.log(`     (${nonAscii} non-ASCII characters streamed)`);
});

test('stop the default server: exit 0, one line on stdout in all', async () => {
  const x = await S.stop();
  eq(x.code, 0, `exit status on SIGTERM (stderr: ${S.tail(1500)})`);
  eq(S.stdout, S.line + '\n', 'everything the server printed on stdout');
});

test('-c / --ctx-size: generation ends at the context as ringlm run -c', async () => {
  await withServer(['-c', '64', '--memory-budget', '65536K'], async (s) => {
    eq((await s.health()).memory_budget, 64 << 20, '/health memory_budget of --memory-budget 65536K');
    const want = await runText(P, ['-c', '64', '-n', '-1', '--temp', '0', '--ignore-eos']);
    const r = status(await s.post('/v1/completions', { prompt: P, ...greedy }), 200, 'a completion without max_tokens under -c 64');
    eq(r.choices[0].text, want, 'the text up to the context vs ringlm run -c 64 -n -1');
    eq(r.choices[0].finish_reason, 'length', 'finish_reason at the context');
    between(r.usage.prompt_tokens + r.usage.completion_tokens, 60, 64, 'prompt + completion tokens under -c 64');
    errorBody(await s.post('/v1/completions', { prompt: 'the cat sat on the mat. '.repeat(20), max_tokens: 1 }), 400,
      'a prompt longer than -c 64', { type: 'invalid_request_error', param: 'prompt' });
  });
});

test('401 with --api-key and RINGLM_API_KEY; SIZE suffixes', async () => {
  const body = { prompt: 'x', max_tokens: 1 };
  const check = async (s, key) => {
    eq((await s.get('/health')).status, 200, '/health without a key');
    for (const [m, p, b] of [['GET', '/v1/models'], ['GET', '/metrics'], ['POST', '/v1/completions', body],
      ['POST', '/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], max_tokens: 1 }], ['POST', '/tokenize', { content: 'x' }],
      ['POST', '/detokenize', { tokens: [5] }]]) {
      errorBody(await s.request(m, p, { body: b }), 401, `${m} ${p} without a key`);
      errorBody(await s.request(m, p, { body: b, headers: { Authorization: 'Bearer wrong' } }), 401, `${m} ${p} with a wrong key`);
      errorBody(await s.request(m, p, { body: b, headers: { Authorization: key } }), 401, `${m} ${p} with the key but no Bearer`);
      status(await s.request(m, p, { body: b, headers: { Authorization: `Bearer ${key}` } }), 200, `${m} ${p} with the key`);
    }
  };
  await withServer(['--api-key', 'sekret-1', '--memory-budget', '512M'], async (s) => {
    await check(s, 'sekret-1');
    eq((await s.health()).memory_budget, 512 * 1024 * 1024, '/health memory_budget of --memory-budget 512M');
  });
  await withServer(['--memory-budget', '2G'], async (s) => {
    await check(s, 'from-the-env');
    eq((await s.health()).memory_budget, 2 * 2 ** 30, '/health memory_budget of --memory-budget 2G');
  }, { RINGLM_API_KEY: 'from-the-env' });
});

test('413 over --max-body-bytes; idle clients time out (--timeout)', async () => {
  await withServer(['--max-body-bytes', '2048', '--timeout', '2'], async (s) => {
    const big = { prompt: 'a '.repeat(2000), max_tokens: 1 };
    errorBody(await s.post('/v1/completions', big), 413, 'a 4 KB body (Content-Length) over --max-body-bytes 2048');
    errorBody(await s.post('/v1/completions', big, { chunked: true }), 413, 'a 4 KB chunked body over --max-body-bytes 2048');
    status(await s.post('/v1/completions', { prompt: 'a '.repeat(400), max_tokens: 1 }), 200, 'a 1 KB body');
    const hi = 2 + 4 * SLOW;
    const [idle, half] = await Promise.all([
      idleConnection(s.port, null, hi * 1000 + 2000),
      idleConnection(s.port, 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"pro', hi * 1000 + 2000),
    ]);
    for (const [t, what] of [[idle, 'a client that sends nothing'], [half, 'a client that sends half a request']]) {
      ok(t !== null, `${what}: still connected after ${hi + 2} s with --timeout 2`);
      between(t, 1, hi, `${what}: seconds until the server closed it (--timeout 2)`);
    }
    status(await s.post('/v1/completions', { prompt: 'x', max_tokens: 1 }), 200, 'a request after the timeouts');
  });
});

/* The KV bytes `ringlm run` reports on its stats line for PROMPT, -n N. */
async function runKvBytes(prompt, n) {
  const { stderr } = await cli(['run', '-p', prompt, '-n', String(n), '--no-display-prompt']);
  const m = /KV ([\d.]+) (B|KiB|MiB|GiB)\b/.exec(stderr);
  ok(m, 'ringlm run: no "KV SIZE" on its stats line', stderr);
  return Number(m[1]) * 1024 ** ['B', 'KiB', 'MiB', 'GiB'].indexOf(m[2]);
}

test('503 + Retry-After when a request cannot fit --memory-budget', async () => {
  // Budget: the weights (as /health reports them) and twice the KV of a
  // 1-token run: room for a short request, not for 3000 positions.
  const weights = (await withServer([], (s) => s.health())).weights_bytes;
  const kv1 = await runKvBytes('The', 1);
  const budget = Math.ceil(weights + 2 * kv1 + 65536);
  await withServer(['--memory-budget', String(budget)], async (s) => {
    eq((await s.health()).memory_budget, budget, '/health memory_budget');
    const small = { prompt: 'The', max_tokens: 1, temperature: 0 };
    status(await s.post('/v1/completions', small), 200, `max_tokens 1 under --memory-budget ${budget} (weights ${weights}, KV of a 1-token run ${kv1})`);
    for (const [p, body] of [['/v1/completions', { prompt: 'The', max_tokens: 3000, ignore_eos: true }],
      ['/v1/completions', { prompt: 'The', max_tokens: 3000, ignore_eos: true, stream: true }],
      ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], max_tokens: 3000 }],
      ['/v1/completions', { prompt: 'The' }]]) {
      const what = `POST ${p} ${JSON.stringify(body)} under --memory-budget ${budget}`;
      const r = await s.post(p, body);
      errorBody(r, 503, what);
      ok(/^\d+$/.test(r.headers['retry-after'] || ''), `${what}: expected a Retry-After header (seconds)`, r.headers['retry-after']);
    }
    status(await s.post('/v1/completions', small), 200, 'max_tokens 1 after the 503s');
    const m = await s.metrics();
    ok(m.get('ringlm_requests_total{status="503"}') >= 4, 'requests_total{status="503"}: expected 4', m.get('ringlm_requests_total{status="503"}'));
  });
});

test('503 + Retry-After when the queue is full (-np 1 --queue 1)', async () => {
  await withServer(['-np', '1', '--queue', '1'], async (s) => {
    const long = { prompt: 'The', max_tokens: 1000, ignore_eos: true, temperature: 0, stream: true };
    const first = s.stream('/v1/completions', long);
    await first.until(() => first.events.length > 0, 'the first chunk of the running request');
    /* the first chunk may come before the engine takes the request off the queue */
    await waitFor(async () => (await s.health()).rows_busy === 1, 'the running request on its row');
    const short = { prompt: 'It', max_tokens: 16, ignore_eos: true, temperature: 0, stream: true };
    const two = [s.stream('/v1/completions', short), s.stream('/v1/completions', short)];
    await waitFor(() => two.some((x) => x.status === 503) || two.every((x) => x.status !== undefined),
      'an answer to one of two requests behind a busy row and a full queue');
    eq(two.map((x) => x.status).filter((x) => x === 503).length, 1, `503s of two requests behind a busy row and a full queue of 1 (statuses ${two.map((x) => x.status)})`);
    const shed = two.find((x) => x.status === 503), waiting = two.find((x) => x !== shed);
    errorBody(await shed.finished, 503, 'queue full');
    ok(/^\d+$/.test(shed.headers['retry-after'] || ''), 'queue full: expected a Retry-After header', shed.headers['retry-after']);
    const h = await s.health();
    eq([h.rows_busy, h.rows_free, h.queue], [1, 0, 1], '/health [rows_busy, rows_free, queue] with one running and one waiting');
    first.destroy();
    const w = checkStream(await waiting.finished, { chat: false }, 'the queued request, once the row is free');
    eq(w.finish[0], 'length', 'the queued request ran to max_tokens');
  });
});

await main();
