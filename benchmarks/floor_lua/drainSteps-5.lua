--[[
  The floor of Redis work for draining a DAG (benchmarks only, never the engine):
  complete a batch of steps, then claim up to N ready steps, in one call. Nothing
  else: no ledger, no claim tokens or leases, no outputs, no status per step, no
  control checks. Readiness uses the engine's scheme (dependency counters, a ready
  sorted set scored by topological order), so the same DAG costs the same
  O(children) per completion.

  Input:
    KEYS[1] meta hash: total, done, started_ms, finished_ms
    KEYS[2] pending hash: step -> unfinished dependencies
    KEYS[3] children hash: step -> comma-separated dependents
    KEYS[4] order hash: step -> topological index (the ready-set score)
    KEYS[5] ready zset: claimable steps, score = topological order
    ARGV[1] maximum number of steps to claim
    ARGV[2..] steps this caller completed

  Output:
    {done, claimed...}
      done: 1 once every step is complete (the call that completed the last one
      records finished_ms; a call that claims nothing checks), else 0;
      claimed: the step ids claimed by this call
]]
local meta, pending, children, order, ready = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local want = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- HMGET over at most 1000 fields per call (Lua's C stack limits unpack).
local function hmget(key, names)
  local out = {}
  for i = 1, #names, 1000 do
    local part = redis.call('HMGET', key, unpack(names, i, math.min(i + 999, #names)))
    for _, v in ipairs(part) do out[#out + 1] = v end
  end
  return out
end

local completed = #ARGV - 1
if completed > 0 then
  local lists = hmget(children, {unpack(ARGV, 2)})
  local dec, seen = {}, {}
  for _, list in ipairs(lists) do
    if list then
      for child in string.gmatch(list, '[^,]+') do
        if not dec[child] then dec[child] = 0; seen[#seen + 1] = child end
        dec[child] = dec[child] + 1
      end
    end
  end
  local readied = {}
  for _, child in ipairs(seen) do
    if redis.call('HINCRBY', pending, child, -dec[child]) <= 0 then
      readied[#readied + 1] = child
    end
  end
  if #readied > 0 then
    local scores = hmget(order, readied)
    for i = 1, #readied, 500 do
      local za = {}
      for j = i, math.min(i + 499, #readied) do
        za[#za + 1] = scores[j]
        za[#za + 1] = readied[j]
      end
      redis.call('ZADD', ready, unpack(za))
    end
  end
  local done = redis.call('HINCRBY', meta, 'done', completed)
  if done >= tonumber(redis.call('HGET', meta, 'total')) then
    redis.call('HSET', meta, 'finished_ms', now)
    return {1}
  end
end

local result = {0}
if want > 0 then
  local popped = redis.call('ZPOPMIN', ready, want)
  for i = 1, #popped, 2 do result[#result + 1] = popped[i] end
  if #popped > 0 then redis.call('HSETNX', meta, 'started_ms', now) end
end
if #result == 1 then
  local m = redis.call('HMGET', meta, 'done', 'total')
  if tonumber(m[1]) >= tonumber(m[2]) then return {1} end
end
return result
