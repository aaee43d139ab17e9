--[[
  Reserve one run slot and a worker share of a runtime instance before dispatching
  to it, so two dispatchers reading the same (possibly stale) capacity descriptor
  cannot overfill it: neither its run slots nor its workers (a run takes
  min(workers per run, available workers) workers, as the runtime starts it).
  Reservations made before the descriptor was published (minus a grace period) are
  already reflected in it and are dropped, as are expired ones. Every time is
  Redis time: the descriptor's publication is given as its age, measured by Redis.

  Members are '<reservation id>|<worker share>', score = reservation time (ms).

  Input:
    KEYS[1] the instance's reservations zset (air:{r:<instance>}:reservations)
    ARGV[1] reservation id
    ARGV[2] free run slots according to the descriptor
    ARGV[3] age of the descriptor in ms, measured by Redis (-1: unknown; then only
            the TTL expires reservations)
    ARGV[4] reservation TTL, ms
    ARGV[5] grace, ms (a reservation this much older than the descriptor is reflected)
    ARGV[6] free workers according to the descriptor
    ARGV[7] workers one run takes at most (min(workers, max local workers per run))

  Output:
    {1, reservedNow, member}    reserved; member is what release removes
    {-7, reservedNow, 'slots'}  no free run slot left
    {-7, reservedNow, 'workers'} no free worker left
]]
--- @include "nowMs"

local key = KEYS[1]
local now = nowMs()
local age = tonumber(ARGV[3])
local cutoff = now - tonumber(ARGV[4])
if age >= 0 then cutoff = math.max(cutoff, now - age - tonumber(ARGV[5])) end
redis.call('ZREMRANGEBYSCORE', key, '-inf', cutoff)
local members = redis.call('ZRANGE', key, 0, -1)
local used = 0
for _, m in ipairs(members) do
  used = used + (tonumber(string.match(m, '|(%d+)$')) or 1)
end
if #members >= tonumber(ARGV[2]) then return {-7, #members, 'slots'} end
local free = tonumber(ARGV[6]) - used
if free <= 0 then return {-7, #members, 'workers'} end
local share = math.min(tonumber(ARGV[7]), free)
local member = ARGV[1] .. '|' .. share
redis.call('ZADD', key, now, member)
redis.call('PEXPIRE', key, tonumber(ARGV[4]))
return {1, #members + 1, member}
