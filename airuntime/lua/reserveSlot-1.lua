--[[
  Reserve one run slot (or up to ARGV[8] of them, for a pump's batch) and a worker share of a runtime instance before dispatching
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
    ARGV[8] optional: how many run slots to reserve at most (default 1); members of a
            batch are '<reservation id>.<n>|<worker share>'

  Output:
    {1, reservedNow, member, ...} reserved (one member per slot reserved, at least one);
                                  each member is what release removes
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
local want = tonumber(ARGV[8] or '1')
local out = {1, #members}
local slotsLeft = tonumber(ARGV[2]) - #members
while want > 0 and slotsLeft > 0 and free > 0 do
  local share = math.min(tonumber(ARGV[7]), free)
  local member = ARGV[1] .. '|' .. share
  if ARGV[8] then member = ARGV[1] .. '.' .. (#out - 1) .. '|' .. share end
  redis.call('ZADD', key, now, member)
  out[#out + 1] = member
  out[2] = out[2] + 1
  free = free - share
  slotsLeft = slotsLeft - 1
  want = want - 1
end
redis.call('PEXPIRE', key, tonumber(ARGV[4]))
return out
