-- The one wrk script of scripts/bench, configured by the environment:
--   BENCH_METHOD  GET or POST (default POST)
--   BENCH_BODY    body size in bytes (default 0: no body)
--   BENCH_KEY     new  a new Idempotency-Key per request: <nonce>-<thread>-<counter>
--                 same the one key BENCH_NONCE for every request (replays)
--                 none no key (default)
--                 head no key, and a realistic 1.5 KiB request head: a bearer token,
--                      cookies, traceparent, a user agent (the same on every request)
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

-- A request head as browsers and SDKs send them: a JWT-shaped bearer token
-- (three base64url parts), a session's cookies, W3C trace context, a user agent.
local function b64url(n, seed)
   local a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
   local t = {}
   for i = 1, n do
      local j = (i * 7 + seed * 13) % 64 + 1
      t[i] = a:sub(j, j)
   end
   return table.concat(t)
end

local realistic_head = {
   ["Authorization"] = "Bearer eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCIsImtpZCI6ImJlbmNoLTEifQ." ..
      b64url(560, 1) .. "." .. b64url(290, 2),
   ["Cookie"] = "session_id=" .. b64url(96, 3) .. "; csrftoken=" .. b64url(64, 4) ..
      "; _ga=GA1.2.1234567890.1700000000; _gid=GA1.2.987654321.1700000000; " ..
      "prefs=" .. b64url(80, 5) .. "; theme=dark; locale=en-US",
   ["traceparent"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
   ["User-Agent"] = "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 " ..
      "(KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36 payments-sdk/4.2.0",
   ["Accept"] = "application/json",
   ["Accept-Language"] = "en-US,en;q=0.9",
}

function init(args)
   wrk.method = method
   wrk.body = body
   wrk.headers["Content-Type"] = "application/json"
   if key_mode == "head" then
      local bytes = 0
      for k, v in pairs(realistic_head) do
         wrk.headers[k] = v
         bytes = bytes + #k + #v + 4
      end
      if tid == 1 then io.write(string.format("BENCH_HEAD_BYTES=%d\n", bytes)) end
   end
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
