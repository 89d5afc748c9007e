-- The one wrk script of scripts/bench, configured by the environment:
--   BENCH_METHOD  GET or POST (default POST)
--   BENCH_BODY    body size in bytes (default 0: no body)
--   BENCH_KEY     new  a new Idempotency-Key per request: <nonce>-<thread>-<counter>
--                 same the one key BENCH_NONCE for every request (replays)
--                 none no key (default)
--   BENCH_NONCE   makes the keys of one run unlike those of every other run
--   BENCH_QUOTA   with new keys: each thread stops after this many responses
-- done() prints one line for scripts/bench to parse:
--   BENCH requests=N duration_us=N p50_us=N p99_us=N status_err=N socket_err=N
-- wrk calls request() for every request only when it is defined: the static
-- modes (same, none) leave it undefined, so wrk formats their request once.

local method = os.getenv("BENCH_METHOD") or "POST"
local body_size = tonumber(os.getenv("BENCH_BODY") or "0")
local key_mode = os.getenv("BENCH_KEY") or "none"
local nonce = os.getenv("BENCH_NONCE") or "run"
local quota = tonumber(os.getenv("BENCH_QUOTA") or "0")

local thread_no = 0
function setup(thread)
   thread_no = thread_no + 1
   thread:set("tid", thread_no)
end

local function make_body(n)
   if n <= 0 then return nil end
   -- a JSON object of exactly n bytes: {"p":"xxx...x"}
   if n < 8 then return string.rep("x", n) end
   return '{"p":"' .. string.rep("x", n - 8) .. '"}'
end

local body = make_body(body_size)

function init(args)
   wrk.method = method
   wrk.body = body
   wrk.headers["Content-Type"] = "application/json"
   if key_mode == "same" then
      wrk.headers["Idempotency-Key"] = nonce
   end
end

if key_mode == "new" then
   local counter = 0
   local headers = { ["Content-Type"] = "application/json" }
   function request()
      counter = counter + 1
      headers["Idempotency-Key"] = nonce .. "-" .. tid .. "-" .. counter
      return wrk.format(method, nil, headers, body)
   end
   if quota > 0 then
      local responses = 0
      function response(status, hdrs, resp_body)
         responses = responses + 1
         if responses >= quota then wrk.thread:stop() end
      end
   end
end

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      "BENCH requests=%d duration_us=%d p50_us=%d p99_us=%d status_err=%d socket_err=%d\n",
      summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
      e.status, e.connect + e.read + e.write + e.timeout))
end
