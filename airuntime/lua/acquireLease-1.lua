--[[
  Acquire one distributed concurrency lease of a throttle scope. Expired holders
  are dropped first, so a crashed holder's capacity comes back after its TTL.
  Re-acquiring with the same holder id refreshes it (idempotent).

  Input:
    KEYS[1] the scope's holders zset (score = lease expiry ms)
    ARGV[1] holder id
    ARGV[2] limit (>= 1)
    ARGV[3] lease TTL, milliseconds

  Output:
    {1, holders}          acquired
    {-7, retryAfterMs}    scope full; the earliest lease expires in retryAfterMs
]]
--- @include "nowMs"

local holdersKey = KEYS[1]
local holder, limit, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = nowMs()
redis.call('ZREMRANGEBYSCORE', holdersKey, '-inf', now)
if redis.call('ZSCORE', holdersKey, holder) then
  redis.call('ZADD', holdersKey, now + ttl, holder)
  return {1, redis.call('ZCARD', holdersKey)}
end
local count = redis.call('ZCARD', holdersKey)
if count >= limit then
  local first = redis.call('ZRANGE', holdersKey, 0, 0, 'WITHSCORES')
  return {-7, math.max(0, tonumber(first[2]) - now)}
end
redis.call('ZADD', holdersKey, now + ttl, holder)
local pttl = redis.call('PTTL', holdersKey)
if pttl < ttl then redis.call('PEXPIRE', holdersKey, ttl) end
return {1, count + 1}
