-- The key modes of bench.loadgen for wrk: `wrk -s bench/wrk_keys.lua URL -- name=value ...`.
--
-- bench/wrk.py runs it; see that module for why wrk and how a row is measured.
-- Every request is the one bench.loadgen sends: `method`, a JSON body (with
-- Content-Type: application/json), and a bare `Idempotency-Key` header chosen
-- by `mode`. The body is the file `body` (bench.loadgen.JsonBodies's template)
-- with the request's key written over it at byte `tag_at` (0-based; `tag_room`
-- bytes fit): the bytes JsonBodies makes for that key, so every new key is a
-- distinct request (the gateway refuses a new key for the same request as one
-- in flight) and a replayed key sends what bench.wrk's warm-up sent under it.
-- Requests without a key (none, lookup) send the file as it is.
--
--   new     a unique key per request: "{run}-t{thread}-{n}";
--   replay  "{run}-r{i}" for i cycling through 0 .. replay-1: the keys
--           bench.wrk sent once, with aiohttp, before this run;
--   mix10   like new, but 10% of requests reuse a key this thread sent at
--           least `lag` new keys earlier (4 x connections: with one request
--           in flight per connection it has almost surely completed);
--   none    no header;
--   lookup  no header; the path is `head` .. key .. `tail`, the key a random
--           line of the file `keys` (pre-filled keys, bench.prefill.fill_key).
--
-- Arguments (name=value, after wrk's "--"): mode, run, method, body, tag_at,
-- tag_room, replay, lag, keys, head, tail. `run` is unique per wrk run (for replay: the prefix
-- of the keys sent beforehand); setup() numbers the threads so that two
-- threads never make the same key.
--
-- Each thread counts its responses by status; done() adds them up and prints
-- one line, "WRK_RESULT {json}", with wrk's own counts and latencies
-- (microseconds), for bench/wrk.py to read.

local REUSE_SHARE = 0.10
local threads = {}

function setup(thread)
   -- Runs in wrk's main Lua state, before the thread's init(): `id` becomes a
   -- global of the thread's own state, and done() reads the thread back.
   thread:set("id", #threads)
   threads[#threads + 1] = thread
end

-- Per thread (each thread has its own Lua state, so these are per thread too).
local mode, run, method, body, request_headers
local tag_at, tag_room, body_head, body_tails = 0, 0, nil, {}
local replay_count, lag, pool = 0, 0, 0
local lookup_keys, head, tail
local sent, fresh, recent = 0, 0, {}
local static_request

local function read_file(path)
   local file = assert(io.open(path, "rb"))
   local text = file:read("*a")
   file:close()
   return text
end

function init(args)
   -- args[0] is the URL, then whatever followed "--".
   local options = {}
   for i = 0, #args do
      local name, value = string.match(args[i] or "", "^([%a_]+)=(.*)$")
      if name then
         options[name] = value
      end
   end
   mode = assert(options.mode, "mode= is required")
   run = options.run or ""
   method = options.method or "POST"
   request_headers = {}
   for name, value in pairs(wrk.headers) do -- wrk's Host header (with the port)
      request_headers[name] = value
   end
   if options.body then
      body = read_file(options.body)
      request_headers["Content-Type"] = "application/json"
      tag_at = assert(tonumber(options.tag_at), "a body needs tag_at=")
      tag_room = assert(tonumber(options.tag_room), "a body needs tag_room=")
      body_head = string.sub(body, 1, tag_at)
   end
   replay_count = tonumber(options.replay or "0")
   lag = tonumber(options.lag or "0")
   pool = math.max(10000, 2 * lag) -- the reuse pool, like bench.loadgen's, bounded
   if mode == "replay" then
      assert(replay_count > 0, "replay needs replay= >= 1")
   elseif mode == "lookup" then
      lookup_keys = {}
      for line in io.lines(assert(options.keys, "lookup needs keys=")) do
         lookup_keys[#lookup_keys + 1] = line
      end
      assert(#lookup_keys > 0, "the keys file is empty")
      head, tail = options.head or "/", options.tail or ""
   elseif mode == "none" then
      static_request = wrk.format(method, wrk.path, request_headers, body)
   elseif mode ~= "new" and mode ~= "mix10" then
      error("unknown mode " .. mode)
   end
   math.randomseed(0x1DE + id)
   statuses = {} -- a global: done() reads it with thread:get()
end

local function next_key()
   sent = sent + 1
   if mode == "replay" then
      return run .. "-r" .. ((sent + id) % replay_count)
   end
   if mode == "mix10" and math.random() < REUSE_SHARE then
      local window = math.min(fresh, pool)
      if window > lag then
         local back = math.random(lag, window - 1)
         return recent[(fresh - back) % pool]
      end
   end
   fresh = fresh + 1
   local key = run .. "-t" .. id .. "-" .. fresh
   if mode == "mix10" then
      recent[fresh % pool] = key
   end
   return key
end

-- The body of a request under `key`: the template's head, the key, and the rest of
-- the template after as many bytes (one tail per key length, made once).
local function body_for(key)
   if body == nil then
      return nil
   end
   local length = #key
   local tail = body_tails[length]
   if tail == nil then
      assert(length <= tag_room, "a key longer than the body's room for it")
      tail = string.sub(body, tag_at + length + 1)
      body_tails[length] = tail
   end
   return body_head .. key .. tail
end

function request()
   if static_request then
      return static_request
   end
   if mode == "lookup" then
      local key = lookup_keys[math.random(#lookup_keys)]
      return wrk.format(method, head .. key .. tail, request_headers, body)
   end
   local key = next_key()
   request_headers["Idempotency-Key"] = key
   return wrk.format(method, wrk.path, request_headers, body_for(key))
end

function response(status, headers, body)
   statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
   local total = {}
   for _, thread in ipairs(threads) do
      for status, count in pairs(thread:get("statuses") or {}) do
         total[status] = (total[status] or 0) + count
      end
   end
   local cells = {}
   for status, count in pairs(total) do
      cells[#cells + 1] = string.format('"%d":%d', status, count)
   end
   local errors = summary.errors
   io.write(string.format(
      'WRK_RESULT {"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,'
         .. '"timeout":%d,"p50_us":%d,"p99_us":%d,"max_us":%d,"statuses":{%s}}\n',
      summary.requests, summary.duration, errors.connect, errors.read, errors.write,
      errors.timeout, latency:percentile(50), latency:percentile(99), latency.max,
      table.concat(cells, ",")
   ))
end
