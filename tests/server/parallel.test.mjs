// server_parallel: 16 simultaneous greedy streams on 8 rows, each equal
// to its prompt run alone through `ringlm run`; again with n-gram lookup,
// a draft model and a 4-bit KV cache (run with the same flags).
import { DRAFT_DIR, checkStream, eq, limited, main, ok, runText, sleep, test, withServer } from './lib.mjs';

const PROMPTS = [
  'The jury said that', 'It was the first time', 'She looked at him and', 'In the morning the',
  'He had never seen', 'The city council voted', 'After the war, the', 'My mother used to',
  'The game was', 'When the train stopped', 'They walked into the', 'A new law',
  'The president told reporters', 'I remember the day', 'The church stood', 'Nobody knew why the',
];
const N = 16;
let plainLine;

async function sixteen(flags, label) {
  // What each prompt gives alone, two runs at a time (2 cores).
  const want = await limited(PROMPTS.map((p) => () => runText(p, ['-n', String(N), '--temp', '0', '--ignore-eos', ...flags])), 2);
  await withServer(['-np', '8', ...flags], async (s) => {
    let maxBusy = 0, polling = true;
    const poll = (async () => {
      while (polling) {
        const h = await s.health();
        maxBusy = Math.max(maxBusy, h.rows_busy);
        ok(h.rows_busy + h.rows_free === 8, `/health rows_busy + rows_free with -np 8`, h);
        await sleep(10);
      }
    })();
    poll.catch(() => {}); // awaited below
    const streams = PROMPTS.map((prompt) => s.stream('/v1/completions', {
      prompt, max_tokens: N, temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true },
    }));
    const done = await Promise.all(streams.map((st) => st.finished));
    polling = false;
    await poll;
    done.forEach((st, i) => {
      const what = `${label}: stream ${i} ${JSON.stringify(PROMPTS[i])}`;
      const g = checkStream(st, { chat: false, includeUsage: true }, what);
      eq(g.text, want[i], `${what} vs ringlm run ${flags.join(' ')}`);
      eq(g.usage.completion_tokens, N, `${what}: completion_tokens`);
    });
    ok(maxBusy >= 2 && maxBusy <= 8, `${label}: most rows busy at once seen by /health: expected 2..8 (batched)`, maxBusy);
    const line = s.line.replace(/http:\/\/\S+/, 'URL');
    if (!flags.length) plainLine = line;
    else if (flags.includes('--kv-bits')) ok(line !== plainLine, `${label}: the startup line names the KV settings (as the dense one: ${plainLine})`, line);
  });
}

test('16 greedy streams on -np 8 = ringlm run', () => sixteen([], 'plain'));
test('16 streams with --lookup 3 = ringlm run --lookup 3', () => sixteen(['--lookup', '3'], '--lookup 3'));
test('16 streams with --draft = ringlm run --draft', () => sixteen(['--draft', DRAFT_DIR], '--draft'));
test('16 streams with --kv-bits 4 = ringlm run --kv-bits 4', () => sixteen(['--kv-bits', '4'], '--kv-bits 4'));

await main();
