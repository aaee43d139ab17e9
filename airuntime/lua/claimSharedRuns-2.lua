--[[
  Claim up to ARGV[4] of the oldest Pending items of one tenant's shared queue for one
  pump, in queue order. The batch form of claimSharedRun: the pump reads the heads of
  every tenant's queue, picks the oldest items over all of them and calls this once
  per tenant with its share, all in one round trip (SharedQueue.claim_batch). Items
  whose claim lease expired go back to Pending first, as in claimSharedRun.

  Input:
    KEYS[1] the tenant's pending zset (air:{q:<tenant>}:pending)
    KEYS[2] the tenant's claimed zset (air:{q:<tenant>}:claimed)
    ARGV[1] the tenant's item key prefix (air:{q:<tenant>}:item:)
    ARGV[2] claimer (pump identity)
    ARGV[3] claim lease, milliseconds
    ARGV[4] most items to claim (>= 1)

  Output:
    {recoveredCount, SharedRunId1, claimToken1, tenantId1, score1, SharedRunId2, ...}
    (score: the item's place in the queue, enqueue time in microseconds)
    ({recoveredCount} alone when nothing is pending)
]]
--- @include "nowMs"
--- @include "claimQueueItem"
--- @include "recoverClaims"

local pendingKey, claimedKey = KEYS[1], KEYS[2]
local prefix, claimer, leaseMs = ARGV[1], ARGV[2], tonumber(ARGV[3])
local most = tonumber(ARGV[4])
local now, nowUs = nowMs()
local recovered = recoverClaims(claimedKey, pendingKey, prefix, now, nowUs)
local out = {recovered}
for _, srid in ipairs(redis.call('ZRANGE', pendingKey, 0, most - 1)) do
  local item = redis.call('HMGET', prefix .. srid, 'tenant_id', 'score')
  local token = claimQueueItem(pendingKey, claimedKey, prefix .. srid, srid, claimer, leaseMs, now)
  out[#out + 1] = srid
  out[#out + 1] = token
  out[#out + 1] = item[1] or ''
  out[#out + 1] = item[2] or '0'
end
return out
