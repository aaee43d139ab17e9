--[[
  Extend a held concurrency lease.

  Input:
    KEYS[1] the scope's holders zset
    ARGV[1] holder id
    ARGV[2] lease TTL, milliseconds

  Output:
    1 renewed, 0 not held any more (expired and dropped: the holder lost it)
]]
--- @include "nowMs"

local holdersKey = KEYS[1]
local now = nowMs()
local score = redis.call('ZSCORE', holdersKey, ARGV[1])
if not score or tonumber(score) <= now then
  redis.call('ZREM', holdersKey, ARGV[1])
  return 0
end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', holdersKey, 'XX', now + ttl, ARGV[1])
if redis.call('PTTL', holdersKey) < ttl then redis.call('PEXPIRE', holdersKey, ttl) end
return 1
