-- The issue's wrk harness: `wrk -t1 -c64 -d5s -s bench/wrk_defaults.lua URL -- name=value ...`.
--
-- bench/defaults.py runs it; with no arguments after "--" it is the harness of the
-- issue exactly: every request a POST of one constant 200-byte JSON body
-- (Content-Type: application/json) with `Authorization: Bearer bench-tenant`, and
--
--   mode=miss    Idempotency-Key fresh per request: "miss-{run}-{n}";
--   mode=replay  Idempotency-Key "replay-{n mod keys}" (keys=50): keys that
--                bench/defaults.py sent once beforehand, so every answer replays.
--
-- The other arguments exist to move one factor at a time toward bench.run's own
-- harness (bench/wrk_keys.lua, see bench/defaults_factors.py):
--
--   auth=VALUE    the Authorization header ("" sends none); default "Bearer bench-tenant"
--   distinct=1    write each request's key over the body's padding (as
--                 bench.loadgen.JsonBodies does): a distinct body per key
--   keys=N        how many replay keys (default 50)
--   prefix=TEXT   the replay keys' prefix (default "replay-")
--   run=TEXT      part of every miss key, unique per wrk run (default "0")
--
-- Each thread counts its answers by status and, for replay, the 2xx answers that
-- carried `Idempotent-Replayed: true`; done() prints one line "WRK_RESULT {json}"
-- in the form of bench/wrk_keys.lua's (plus "replayed"), for bench/defaults.py.

local threads = {}

function setup(thread)
   thread:set("id", #threads)
   threads[#threads + 1] = thread
end

local HEAD = '{"title":"benchmark ticket","pad":"'
local TAIL = '"}'
local SIZE = 200
local mode, run, distinct, keys, prefix
local headers, body, sent

function init(args)
   local options = {}
   for i = 0, #args do
      local name, value = string.match(args[i] or "", "^([%a_]+)=(.*)$")
      if name then
         options[name] = value
      end
   end
   mode = options.mode or "miss"
   assert(mode == "miss" or mode == "replay", "mode: miss or replay")
   run = options.run or "0"
   distinct = options.distinct == "1"
   keys = tonumber(options.keys or "50")
   prefix = options.prefix or "replay-"
   local auth = options.auth
   if auth == nil then
      auth = "Bearer bench-tenant"
   end
   headers = {}
   for name, value in pairs(wrk.headers) do -- wrk's Host header (with the port)
      headers[name] = value
   end
   headers["Content-Type"] = "application/json"
   if auth ~= "" then
      headers["Authorization"] = auth
   end
   body = HEAD .. string.rep("x", SIZE - #HEAD - #TAIL) .. TAIL
   assert(#body == SIZE)
   sent = 0
   statuses = {} -- globals: done() reads them with thread:get()
   replayed = 0
end

-- The body under `key`: the constant one, or with distinct=1 the key over the padding.
local function body_for(key)
   if not distinct then
      return body
   end
   return HEAD .. key .. string.sub(body, #HEAD + #key + 1)
end

function request()
   sent = sent + 1
   local key
   if mode == "replay" then
      key = prefix .. (sent % keys)
   else
      key = "miss-" .. run .. "-" .. id .. "-" .. sent
   end
   headers["Idempotency-Key"] = key
   return wrk.format("POST", wrk.path, headers, body_for(key))
end

function response(status, response_headers, response_body)
   statuses[status] = (statuses[status] or 0) + 1
   if status >= 200 and status < 300 and mode == "replay" then
      local flag = response_headers["Idempotent-Replayed"] or response_headers["idempotent-replayed"]
      if flag == "true" then
         replayed = replayed + 1
      end
   end
end

function done(summary, latency, requests)
   local total, replays = {}, 0
   for _, thread in ipairs(threads) do
      for status, count in pairs(thread:get("statuses") or {}) do
         total[status] = (total[status] or 0) + count
      end
      replays = replays + (thread:get("replayed") or 0)
   end
   local cells = {}
   for status, count in pairs(total) do
      cells[#cells + 1] = string.format('"%d":%d', status, count)
   end
   local errors = summary.errors
   io.write(string.format(
      'WRK_RESULT {"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,'
         .. '"timeout":%d,"p50_us":%d,"p99_us":%d,"max_us":%d,"replayed":%d,"statuses":{%s}}\n',
      summary.requests, summary.duration, errors.connect, errors.read, errors.write,
      errors.timeout, latency:percentile(50), latency:percentile(99), latency.max,
      replays, table.concat(cells, ",")
   ))
end
