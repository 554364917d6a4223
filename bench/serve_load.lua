-- serve_load.lua -- wrk script of bench/serve_load.sh: every connection posts
-- chat completions (prompts in turn, max_tokens SERVE_LOAD_MAX_TOKENS,
-- temperature SERVE_LOAD_TEMPERATURE), counts the answers by status and
-- the completion tokens they report, and done() prints RESULT lines (wrk's
-- latency distribution and error counts) for the shell script to read.

local max_tokens = tonumber(os.getenv("SERVE_LOAD_MAX_TOKENS") or "32")
local temperature = tonumber(os.getenv("SERVE_LOAD_TEMPERATURE") or "0.7")

local prompts = {
  "Tell me about the city council meeting.",
  "What did the jury say about the election?",
  "Describe the weather in the morning.",
  "Write a short story about a train.",
  "Why did the team lose the game?",
  "What happened after the war?",
  "Give me three reasons to read more books.",
  "Who was the first president of the club?",
}

-- Per thread (each wrk thread has its own Lua state).
local threads = {}
statuses = {}
tokens = 0
local counter = 0

function setup(thread)
  thread:set("first", #threads)
  table.insert(threads, thread)
end

function init(args)
  counter = first or 0
end

function request()
  counter = counter + 1
  local p = prompts[(counter % #prompts) + 1]
  local body = string.format(
    '{"model":"ringlm","messages":[{"role":"user","content":"%s"}],"max_tokens":%d,"temperature":%g,"seed":%d}',
    p, max_tokens, temperature, counter)
  return wrk.format("POST", "/v1/chat/completions", { ["Content-Type"] = "application/json" }, body)
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
  if status == 200 then
    local n = body:match('"completion_tokens"%s*:%s*(%d+)')
    if n then tokens = tokens + tonumber(n) end
  end
end

function done(summary, latency, requests)
  local st, tok = {}, 0
  for _, t in ipairs(threads) do
    for k, v in pairs(t:get("statuses") or {}) do st[k] = (st[k] or 0) + v end
    tok = tok + (t:get("tokens") or 0)
  end
  local e = summary.errors
  io.write(string.format("RESULT requests %d\n", summary.requests))
  io.write(string.format("RESULT duration_s %.3f\n", summary.duration / 1e6))
  io.write(string.format("RESULT p50_ms %.1f\n", latency:percentile(50) / 1000))
  io.write(string.format("RESULT p90_ms %.1f\n", latency:percentile(90) / 1000))
  io.write(string.format("RESULT p99_ms %.1f\n", latency:percentile(99) / 1000))
  io.write(string.format("RESULT max_ms %.1f\n", latency.max / 1000))
  io.write(string.format("RESULT client_tokens %d\n", tok))
  io.write(string.format("RESULT err_connect %d\nRESULT err_read %d\nRESULT err_write %d\nRESULT err_timeout %d\n",
    e.connect, e.read, e.write, e.timeout))
  for k, v in pairs(st) do io.write(string.format("RESULT status_%d %d\n", k, v)) end
end
