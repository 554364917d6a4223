// server_lifecycle: a client that disconnects frees its row; SIGTERM and
// SIGINT drain the running streams and exit 0; the prompt cache reuses a
// chat's earlier turn and a shared system prompt (past the sliding window
// too) and answers as a server without a cache does.
import { SLOW, checkStream, checkUsage, eq, main, ok, sleep, status, test, waitFor, withServer, withServers } from './lib.mjs';

const long = { max_tokens: 3000, temperature: 0, ignore_eos: true };
const SENTENCES = [
  'The committee met on Tuesday to discuss the new budget for the schools.',
  'Several members said that the plan would cost more than the city could pay.',
  'The mayor answered that the money would come from the state and not from taxes.',
  'A reporter asked whether the teachers had been told about the changes.',
  'Nobody on the committee could say when the final vote would be held.',
  'Outside the hall, a small crowd waited in the rain for the news.',
];
const longText = (k) => Array.from({ length: k }, (_, i) => SENTENCES[i % SENTENCES.length]).join(' ');
// ~1500 tokens: prefilled in 6 chunks on servers with --prefill-chunk 256.
const LONG_PROMPT = longText(96);
const CHUNK = ['--prefill-chunk', '256'];

async function rowsBusy(s, n, what) {
  await waitFor(async () => (await s.health()).rows_busy === n, `${what}: /health rows_busy ${n}`);
}

test('a client that disconnects frees its row', async () => {
  await withServer(CHUNK, async (s) => {
    const cases = [
      ['a stream dropped mid-way', { prompt: 'The jury said that', stream: true }, 3],
      ['a non-stream request dropped while generating', { prompt: 'The jury said that', stream: false }, 0],
      // Before its first token: dropped while its long prompt is prefilled.
      ['a stream dropped during its prefill', { prompt: LONG_PROMPT, stream: true }, 0],
    ];
    for (const [what, body, chunks] of cases) {
      const m0 = await s.metrics();
      const st = s.stream('/v1/completions', { ...long, ...body });
      if (chunks) await st.until(() => st.events.length >= chunks, `${chunks} chunks`);
      await rowsBusy(s, 1, what);
      const t0 = Date.now();
      st.destroy();
      // A prefill chunk may finish first (slow under the sanitizers).
      const limit = 1000 + (body.prompt === LONG_PROMPT ? 1500 : 500) * SLOW;
      await waitFor(async () => (await s.health()).rows_busy === 0, `${what}: rows_busy back to 0`, limit);
      console.log(`     ${what}: row free ${Date.now() - t0} ms after the disconnect`);
      const m1 = await s.metrics();
      await sleep(300);
      const m2 = await s.metrics();
      const g = (m) => m.get('ringlm_generated_tokens_total');
      eq(g(m2), g(m1), `${what}: generated_tokens_total 300 ms after the row was freed (still generating?)`);
      ok(g(m1) - g(m0) < 3000, `${what}: the dropped request ran to its 3000 tokens`, g(m1) - g(m0));
    }
    const r = status(await s.post('/v1/completions', { prompt: 'It was', max_tokens: 4, temperature: 0 }), 200, 'a request after the disconnects');
    checkUsage(r.usage, 'usage after the disconnects');
    const h = await s.health();
    eq([h.rows_busy, h.queue], [0, 0], '/health [rows_busy, queue] at the end');
  });
});

for (const sig of ['SIGTERM', 'SIGINT']) {
  test(`${sig} mid-stream: the streams finish, then exit 0`, () => withServers([[[]]], async ([s]) => {
    const n = sig === 'SIGTERM' ? 3 : 1, max = 200;
    const streams = Array.from({ length: n }, (_, i) => s.stream('/v1/chat/completions', {
      messages: [{ role: 'user', content: `Story number ${i}.` }], max_tokens: max, temperature: 0, ignore_eos: true,
      stream: true, stream_options: { include_usage: true },
    }));
    for (const st of streams) await st.until(() => st.events.length >= 2, 'two chunks');
    ok(streams.some((st) => !st.doneSeen), `every stream had ended before ${sig}; the test proves nothing`);
    s.proc.kill(sig);
    const x = await s.stop(null, 60000 * SLOW);
    for (const [i, st] of streams.entries()) {
      const g = checkStream(await st.finished, { chat: true, includeUsage: true }, `stream ${i} across ${sig}`);
      eq([g.finish[0], g.usage.completion_tokens], ['length', max], `stream ${i} across ${sig}: [finish_reason, completion_tokens]`);
    }
    eq([x.code, x.signal], [0, null], `exit after ${sig} (stderr: ${s.tail(1500)})`);
  }));
}

test('a long prompt is prefilled in chunks: a running stream keeps going', async () => {
  await withServer(CHUNK, async (s) => {
    const a = s.stream('/v1/completions', { prompt: 'The jury said that', ...long, stream: true });
    await a.until(() => a.events.length >= 5, 'five chunks');
    const t0 = Date.now();
    const r = status(await s.post('/v1/completions', { prompt: LONG_PROMPT, max_tokens: 1, temperature: 0 }), 200, 'a long prompt');
    const t1 = Date.now();
    const times = [t0, ...a.events.map((e) => e.t).filter((t) => t > t0 && t < t1), t1];
    const gap = Math.max(...times.slice(1).map((t, i) => t - times[i]));
    a.destroy();
    console.log(`     ${r.usage.prompt_tokens}-token prompt answered in ${t1 - t0} ms; longest pause of the running stream meanwhile ${gap} ms`);
    ok(r.usage.prompt_tokens > 1200, 'the long prompt is shorter than 1200 tokens', r.usage.prompt_tokens);
    ok(gap < 0.6 * (t1 - t0), `the running stream paused ${gap} ms of the ${t1 - t0} ms the long prompt took (not prefilled in chunks?)`);
  });
});

// ---- the prompt cache -------------------------------------------------------


/* Each conversation's last request on a cached server (after its earlier
 * requests) and alone on a server with --prompt-cache-bytes 0. */
function compare(label, conversations, minCached) {
  return withServers([[[]], [['--prompt-cache-bytes', '0']]], async ([cached, plain]) => {
    for (const steps of conversations) {
      const m0 = await cached.metrics();
      let last;
      for (const body of steps) last = status(await cached.post('/v1/chat/completions', body), 200, `${label}: a request`);
      const m1 = await cached.metrics();
      const hit = last.usage.prompt_tokens_details.cached_tokens;
      console.log(`     ${label}: cached_tokens ${hit} of ${last.usage.prompt_tokens}`);
      ok(hit >= minCached, `${label}: cached_tokens: expected >= ${minCached}`, last.usage);
      ok(m1.get('ringlm_prompt_cache_hit_tokens_total') - m0.get('ringlm_prompt_cache_hit_tokens_total') >= hit,
        `${label}: prompt_cache_hit_tokens_total grew by less than cached_tokens ${hit}`);
      const ref = status(await plain.post('/v1/chat/completions', steps.at(-1)), 200, `${label}: without a cache`);
      eq(ref.usage.prompt_tokens_details.cached_tokens, 0, `${label}: cached_tokens with --prompt-cache-bytes 0`);
      eq(ref.usage.prompt_tokens, last.usage.prompt_tokens, `${label}: prompt_tokens, cached vs not`);
      eq(last.choices[0].message.content, ref.choices[0].message.content, `${label}: content with the cache vs without`);
    }
  });
}

const turn = (messages) => ({ messages, max_tokens: 16, temperature: 0, ignore_eos: true });

async function twoTurns(u1, u2) {
  // The first turn's reply, from a server of its own, goes into the history.
  const r1 = await withServer([], async (s) =>
    status(await s.post('/v1/chat/completions', turn([{ role: 'user', content: u1 }])), 200, 'turn 1').choices[0].message.content);
  return [turn([{ role: 'user', content: u1 }]),
    turn([{ role: 'user', content: u1 }, { role: 'assistant', content: r1 }, { role: 'user', content: u2 }])];
}

test('prompt cache: a second chat turn and a shared system prompt', async () => {
  const sys = { role: 'system', content: longText(3) };
  await compare('second turn', [await twoTurns('Tell me about the committee.', 'And what did the mayor say?')], 1);
  await compare('shared system prompt', [[
    turn([sys, { role: 'user', content: 'Who met on Tuesday?' }]),
    turn([sys, { role: 'user', content: 'Why was the crowd outside?' }]),
  ]], 1);
});

test('prompt cache past the sliding window (128 positions)', async () => {
  // A first turn of ~200 tokens: reuse must cover more than the window.
  await compare('second turn past the window', [await twoTurns(longText(10), 'What happened next?')], 129);
});

await main();
