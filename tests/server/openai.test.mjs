// server_openai: the official `openai` npm client against `ringlm serve`:
// models, chat and completions, stream and non-stream, usage (and
// include_usage), logprobs, errors and the API key. The package comes from
// the npm_setup fixture (RINGLM_NODE_PREFIX/node_modules); without it the
// test is skipped with the reason (a failure under CI=true).
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { MODEL_NAME, between, checkUsage, eq, isInt, main, ok, skip, test, type, withServer } from './lib.mjs';

const prefix = process.env.RINGLM_NODE_PREFIX;
let OpenAI;
try {
  const require = createRequire(path.join(prefix, 'noop.js'));
  OpenAI = require('openai').OpenAI;
  const pkg = path.join(path.dirname(require.resolve('openai')), 'package.json');
  console.log(`openai ${JSON.parse(fs.readFileSync(pkg, 'utf8')).version} from ${prefix}`);
} catch (e) {
  let why = `the openai package is not in ${prefix}/node_modules (${e.code || e.message})`;
  try {
    why = fs.readFileSync(path.join(prefix, 'npm_failed.txt'), 'utf8').trim();
  } catch {}
  skip(why);
}

const greedy = { temperature: 0, ignore_eos: true };
const client = (s, apiKey = 'x') => new OpenAI({ baseURL: `${s.url}/v1`, apiKey, maxRetries: 0, timeout: 120000 });

async function collect(stream, chat) {
  let text = '', finish = null, usage = null, first = true, n = 0;
  for await (const c of stream) {
    n++;
    eq(c.object, chat ? 'chat.completion.chunk' : 'text_completion', 'chunk object');
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      if (chat && first) eq(ch.delta.role, 'assistant', 'the first delta role');
      first = false;
      text += (chat ? ch.delta.content : ch.text) ?? '';
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return { text, finish, usage, n };
}

test('the openai client: models, chat, completions, streams, usage, logprobs', async () => {
  await withServer([], async (s) => {
    const ai = client(s);
    const models = await ai.models.list();
    eq(models.data.map((m) => m.id), [MODEL_NAME], 'models.list() ids');

    const messages = [{ role: 'user', content: 'What did the jury say?' }];
    const c = await ai.chat.completions.create({ model: MODEL_NAME, messages, max_tokens: 12, ...greedy });
    eq(c.object, 'chat.completion', 'chat object');
    eq(c.choices[0].message.role, 'assistant', 'chat message role');
    type(c.choices[0].message.content, 'string', 'chat content');
    eq(c.choices[0].finish_reason, 'length', 'chat finish_reason');
    checkUsage(c.usage, 'chat usage');
    eq(c.usage.completion_tokens, 12, 'chat usage.completion_tokens');

    const cs = await collect(await ai.chat.completions.create({
      model: MODEL_NAME, messages, max_tokens: 12, ...greedy, stream: true, stream_options: { include_usage: true },
    }), true);
    eq(cs.text, c.choices[0].message.content, 'chat stream content vs non-stream');
    eq(cs.finish, 'length', 'chat stream finish_reason');
    ok(cs.usage, 'chat stream with include_usage: no usage chunk');
    eq([cs.usage.prompt_tokens, cs.usage.completion_tokens, cs.usage.total_tokens],
      [c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens], 'chat stream usage vs non-stream');

    const prompt = 'The jury said that';
    const k = await ai.completions.create({ model: MODEL_NAME, prompt, max_tokens: 12, ...greedy });
    eq(k.object, 'text_completion', 'completion object');
    type(k.choices[0].text, 'string', 'completion text');
    checkUsage(k.usage, 'completion usage');
    eq(k.usage.completion_tokens, 12, 'completion usage.completion_tokens');
    isInt(k.created, 'completion created');

    const ks = await collect(await ai.completions.create({
      model: MODEL_NAME, prompt, max_tokens: 12, ...greedy, stream: true, stream_options: { include_usage: true },
    }), false);
    eq(ks.text, k.choices[0].text, 'completion stream text vs non-stream');
    ok(ks.usage, 'completion stream with include_usage: no usage chunk');
    eq(ks.usage.completion_tokens, 12, 'completion stream usage.completion_tokens');
    const plain = await collect(await ai.completions.create({ model: MODEL_NAME, prompt, max_tokens: 4, ...greedy, stream: true }), false);
    eq(plain.usage, null, 'completion stream without include_usage: usage');

    const lc = await ai.chat.completions.create({ model: MODEL_NAME, messages, max_tokens: 4, ...greedy, logprobs: true, top_logprobs: 2 });
    const content = lc.choices[0].logprobs && lc.choices[0].logprobs.content;
    ok(Array.isArray(content) && content.length === 4, 'chat logprobs.content: expected 4 entries', lc.choices[0].logprobs);
    for (const e of content) {
      between(e.logprob, -1e9, 1e-6, 'chat logprob');
      eq(e.top_logprobs.length, 2, 'chat top_logprobs length');
    }
    const lk = await ai.completions.create({ model: MODEL_NAME, prompt, max_tokens: 4, ...greedy, logprobs: 2 });
    ok(lk.choices[0].logprobs && typeof lk.choices[0].logprobs === 'object', 'completion logprobs: expected an object', lk.choices[0].logprobs);

    let err;
    try {
      await ai.completions.create({ model: MODEL_NAME, prompt, top_p: 2 });
    } catch (e) {
      err = e;
    }
    ok(err instanceof OpenAI.BadRequestError, 'top_p 2: expected a BadRequestError', err && `${err.constructor.name} ${err.message}`);
    eq([err.status, err.param, err.type], [400, 'top_p', 'invalid_request_error'], 'top_p 2: [status, param, type]');
  });
});

test('the openai client with --api-key', async () => {
  await withServer(['--api-key', 'k-123'], async (s) => {
    eq((await client(s, 'k-123').models.list()).data[0].id, MODEL_NAME, 'models.list() with the key');
    let err;
    try {
      await client(s, 'not-it').chat.completions.create({ model: MODEL_NAME, messages: [{ role: 'user', content: 'x' }], max_tokens: 1 });
    } catch (e) {
      err = e;
    }
    ok(err instanceof OpenAI.AuthenticationError, 'a wrong key: expected an AuthenticationError', err && `${err.constructor.name} ${err.message}`);
    eq(err.status, 401, 'a wrong key: status');
  });
});

await main();
