#!/usr/bin/env bash
# Load benchmark of `ringlm serve` (not a ctest): starts the server on a free
# loopback port, runs wrk (Debian package wrk) with bench/serve_load.lua
# posting chat completions, samples the server's RSS every second, and
# reports requests, answers by status, p50/p99 latency, aggregate
# completion tokens/s (from /metrics ringlm_generated_tokens_total) and the
# RSS after warm-up. Exit status 1 when an answer other than 2xx or 503, a
# socket error or timeout happened, the RSS drifted more than 5% after
# warm-up, or the server did not exit 0 on SIGTERM.
#
# The prompt cache keeps a snapshot of every finished request's KV until
# --prompt-cache-bytes: RSS grows until it is full. The bench gives it
# 64M by default (--prompt-cache SIZE) so that it fills during warm-up and
# a flat RSS afterwards means no leak; /metrics' ringlm_prompt_cache_bytes
# is reported at the end.
#
# usage: bench/serve_load.sh [--bin build/ringlm] [--model DIR] [--connections 64]
#          [--duration 60s] [--parallel 8] [--threads 2] [--max-tokens 32]
#          [--temperature 0.7] [--warmup SECONDS] [--prompt-cache 64M]
#          [--rss-log FILE] [-- more ringlm serve options]
set -euo pipefail
cd "$(dirname "$0")/.."

bin=build/ringlm model="" connections=64 duration=60s parallel=8 threads=2
max_tokens=32 temperature=0.7 warmup="" cache=64M rss_log="" extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --model|-m) model=$2; shift 2 ;;
    --connections|-c) connections=$2; shift 2 ;;
    --duration|-d) duration=$2; shift 2 ;;
    --parallel|-np) parallel=$2; shift 2 ;;
    --threads|-t) threads=$2; shift 2 ;;
    --max-tokens) max_tokens=$2; shift 2 ;;
    --temperature) temperature=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --prompt-cache) cache=$2; shift 2 ;;
    --rss-log) rss_log=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "serve_load: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
command -v wrk >/dev/null || { echo "serve_load: wrk not found (apt-get install wrk)" >&2; exit 2; }
command -v curl >/dev/null || { echo "serve_load: curl not found (apt-get install curl)" >&2; exit 2; }
[ -x "$bin" ] || { echo "serve_load: $bin is not an executable (--bin)" >&2; exit 2; }

# Seconds of a wrk duration (60, 60s, 2m, 1h).
secs() {
  case "$1" in
    *h) echo $(( ${1%h} * 3600 )) ;; *m) echo $(( ${1%m} * 60 )) ;; *s) echo "${1%s}" ;; *) echo "$1" ;;
  esac
}
dur_s=$(secs "$duration")
[ -n "$warmup" ] || warmup=$(( dur_s / 4 < 10 ? dur_s / 4 : 10 ))

tmp=$(mktemp -d)
pid="" sampler=""
cleanup() {
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null || true
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

args=(serve --port 0 -np "$parallel" --prompt-cache-bytes "$cache")
[ -n "$model" ] && args+=(-m "$model")
"$bin" "${args[@]}" "${extra[@]}" >"$tmp/out" 2>"$tmp/err" &
pid=$!
port=""
for _ in $(seq 600); do
  port=$(head -n1 "$tmp/out" 2>/dev/null | grep -o 'http://127\.0\.0\.1:[0-9]*' | sed 's/.*://' || true)
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || { echo "serve_load: ringlm serve exited:"; cat "$tmp/err"; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "serve_load: no startup line from ringlm serve"; cat "$tmp/err"; exit 1; }
url="http://127.0.0.1:$port"
until curl -sf "$url/health" >/dev/null; do
  kill -0 "$pid" 2>/dev/null || { echo "serve_load: ringlm serve exited:"; cat "$tmp/err"; exit 1; }
  sleep 0.1
done
echo "server: $(head -n1 "$tmp/out")"

metric() { curl -sf "$url/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }
tok0=$(metric ringlm_generated_tokens_total)

# RSS (kB) every second, with the time it was read.
t_start=$(date +%s.%N)
(
  while kill -0 "$pid" 2>/dev/null; do
    rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || true)
    [ -n "$rss" ] && echo "$(date +%s.%N) $rss"
    sleep 1
  done
) >"$tmp/rss" &
sampler=$!

echo "load: wrk -t$threads -c$connections -d$duration, chat completions of $max_tokens tokens at temperature $temperature"
SERVE_LOAD_MAX_TOKENS=$max_tokens SERVE_LOAD_TEMPERATURE=$temperature \
  wrk -t"$threads" -c"$connections" -d"$duration" --timeout 120s --latency -s bench/serve_load.lua "$url" >"$tmp/wrk" 2>&1 || {
  echo "serve_load: wrk failed:"; cat "$tmp/wrk"; exit 1; }
tok1=$(metric ringlm_generated_tokens_total)
cache_bytes=$(metric ringlm_prompt_cache_bytes)
kill "$sampler" 2>/dev/null || true
wait "$sampler" 2>/dev/null || true
sampler=""

r() { awk -v k="$1" '$1 == "RESULT" && $2 == k { print $3; found = 1 } END { if (!found) print 0 }' "$tmp/wrk"; }
requests=$(r requests) wall=$(r duration_s)
fail=0
calc() { awk "BEGIN { printf \"%.${2:-1}f\", $1 }"; }
echo "requests: $requests in ${wall} s ($(calc "$requests / $wall") req/s)"
statuses=$(awk '$1 == "RESULT" && $2 ~ /^status_/ { sub("status_", "", $2); printf "%s %s  ", $2, $3 }' "$tmp/wrk")
echo "answers by status: ${statuses:-none}"
bad=$(awk '$1 == "RESULT" && $2 ~ /^status_/ { s = substr($2, 8) + 0; if ((s < 200 || s > 299) && s != 503) n += $3 } END { print n + 0 }' "$tmp/wrk")
sock=$(( $(r err_connect) + $(r err_read) + $(r err_write) + $(r err_timeout) ))
echo "socket errors: connect $(r err_connect), read $(r err_read), write $(r err_write), timeout $(r err_timeout)"
[ "$bad" -eq 0 ] || { echo "FAIL: $bad answers with a status other than 2xx and 503"; fail=1; }
[ "$sock" -eq 0 ] || { echo "FAIL: $sock socket errors or timeouts"; fail=1; }
[ "$(r status_200)" -gt 0 ] || { echo "FAIL: no request succeeded"; fail=1; }
echo "latency: p50 $(r p50_ms) ms, p90 $(r p90_ms) ms, p99 $(r p99_ms) ms, max $(r max_ms) ms"
gen=$(calc "$tok1 - $tok0" 0)
echo "completion tokens: $gen generated (/metrics), $(r client_tokens) in the 200 answers;" \
  "aggregate $(calc "$gen / $wall") tok/s"

echo "prompt cache at the end: $(( ${cache_bytes:-0} / 1048576 )) MiB (--prompt-cache-bytes $cache)"
[ -n "$rss_log" ] && awk -v t0="$t_start" '{ printf "%.1f %d\n", $1 - t0, $2 }' "$tmp/rss" >"$rss_log"

# RSS after warm-up: flat within 5%.
read -r n lo hi < <(awk -v w="$warmup" -v t0="$t_start" '$1 - t0 >= w { n++; if (n == 1 || $2 < lo) lo = $2; if ($2 > hi) hi = $2 }
  END { print n + 0, lo + 0, hi + 0 }' "$tmp/rss")
if [ "$n" -lt 2 ]; then
  echo "FAIL: fewer than 2 RSS samples after the ${warmup} s warm-up"; fail=1
else
  drift=$(calc "100 * ($hi - $lo) / $lo" 2)
  flat=$(awk "BEGIN { print ($hi <= $lo * 1.05) ? 1 : 0 }")
  echo "RSS after ${warmup} s warm-up ($n samples): min $((lo / 1024)) MiB, max $((hi / 1024)) MiB," \
    "spread ${drift}% ($([ "$flat" -eq 1 ] && echo "within 5%" || echo "OVER 5%"))"
  [ "$flat" -eq 1 ] || fail=1
fi

kill -TERM "$pid"
for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then
  echo "FAIL: ringlm serve still running 30 s after SIGTERM"; fail=1
else
  set +e; wait "$pid"; rc=$?; set -e
  pid=""
  [ "$rc" -eq 0 ] || { echo "FAIL: ringlm serve exited $rc on SIGTERM"; tail -5 "$tmp/err"; fail=1; }
fi
[ "$fail" -eq 0 ] && echo "serve_load: ok" || echo "serve_load: FAILED"
exit "$fail"
