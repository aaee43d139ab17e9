-- Multi-field hash and sorted-set commands over many members at once, in chunks of
-- at most 500 members per call (unpack is bounded by Lua's C stack), so a batch of
-- N steps costs a few commands instead of N.
--   hmgetMany(key, names) -> values, aligned with names (false where absent)
--   hsetMany(key, flat)   flat = {field, value, field, value, ...}
--   zaddMany(key, flat)   flat = {score, member, score, member, ...}
--   zremMany(key, members)
-- A batch of at most 500 (every claim and completion batch) is one call whose reply
-- is returned as it is; larger ones are copied together with a running index (no `#`
-- per element: these loops run once per step of every batch).
local function hmgetMany(key, names)
  local n = #names
  if n <= 500 then
    if n == 0 then return {} end
    return redis.call('HMGET', key, unpack(names))
  end
  local out, k = {}, 0
  for i = 1, n, 500 do
    local part = redis.call('HMGET', key, unpack(names, i, math.min(i + 499, n)))
    for j = 1, #part do
      k = k + 1
      out[k] = part[j]
    end
  end
  return out
end

local function flatCall(cmd, key, flat)
  local n = #flat
  for i = 1, n, 1000 do
    redis.call(cmd, key, unpack(flat, i, math.min(i + 999, n)))
  end
end

local function hsetMany(key, flat) flatCall('HSET', key, flat) end
local function zaddMany(key, flat) flatCall('ZADD', key, flat) end

local function zremMany(key, members)
  local n = #members
  for i = 1, n, 500 do
    redis.call('ZREM', key, unpack(members, i, math.min(i + 499, n)))
  end
end
