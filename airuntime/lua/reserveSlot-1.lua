--[[
  Reserve one run slot of a runtime instance before dispatching to it, so two
  dispatchers reading the same (possibly stale) capacity descriptor cannot overfill
  it. Reservations made before the descriptor's snapshot (minus a grace period)
  are already reflected in it and are dropped, as are expired ones.

  Input:
    KEYS[1] the instance's reservations zset (air:{r:<instance>}:reservations,
            member = reservation id, score = reservation time ms)
    ARGV[1] reservation id
    ARGV[2] free run slots according to the descriptor
    ARGV[3] descriptor snapshot time, ms
    ARGV[4] reservation TTL, ms
    ARGV[5] grace, ms (a reservation this much older than the snapshot is reflected)

  Output:
    {1, reservedNow}   reserved
    {-7, reservedNow}  no free slot left
]]
--- @include "nowMs"

local key = KEYS[1]
local now = nowMs()
local cutoff = math.max(tonumber(ARGV[3]) - tonumber(ARGV[5]), now - tonumber(ARGV[4]))
redis.call('ZREMRANGEBYSCORE', key, '-inf', cutoff)
local count = redis.call('ZCARD', key)
if count >= tonumber(ARGV[2]) then return {-7, count} end
redis.call('ZADD', key, now, ARGV[1])
redis.call('PEXPIRE', key, tonumber(ARGV[4]))
return {1, count + 1}
