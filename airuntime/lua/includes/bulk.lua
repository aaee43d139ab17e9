-- Multi-field hash and sorted-set commands over many members at once, in chunks of
-- at most 500 members per call (unpack is bounded by Lua's C stack), so a batch of
-- N steps costs a few commands instead of N.
--   hmgetMany(key, names) -> values, aligned with names (false where absent)
--   hsetMany(key, flat)   flat = {field, value, field, value, ...}
--   zaddMany(key, flat)   flat = {score, member, score, member, ...}
--   zremMany(key, members)
local function hmgetMany(key, names)
  local out = {}
  for i = 1, #names, 500 do
    local part = redis.call('HMGET', key, unpack(names, i, math.min(i + 499, #names)))
    for j = 1, #part do out[#out + 1] = part[j] end
  end
  return out
end

local function flatCall(cmd, key, flat)
  for i = 1, #flat, 1000 do
    redis.call(cmd, key, unpack(flat, i, math.min(i + 999, #flat)))
  end
end

local function hsetMany(key, flat) flatCall('HSET', key, flat) end
local function zaddMany(key, flat) flatCall('ZADD', key, flat) end

local function zremMany(key, members)
  for i = 1, #members, 500 do
    redis.call('ZREM', key, unpack(members, i, math.min(i + 499, #members)))
  end
end
