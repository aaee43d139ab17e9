--[[
  Claim one specific Pending shared-queue item (DirectDispatch: admission runs at
  submit time for that run, not for whatever is at the head of the queue).

  Input:
    KEYS[1] the tenant's pending zset (air:{q:<tenant>}:pending)
    KEYS[2] the tenant's claimed zset (air:{q:<tenant>}:claimed)
    ARGV[1] the tenant's item key prefix (air:{q:<tenant>}:item:)
    ARGV[2] claimer (pump identity)
    ARGV[3] claim lease, milliseconds
    ARGV[4] SharedRunId

  Output:
    {}                          the item is not Pending (claimed by a pump already, or gone)
    {SharedRunId, claimToken, 0}
]]
--- @include "nowMs"
--- @include "claimQueueItem"

local pendingKey, claimedKey = KEYS[1], KEYS[2]
local prefix, claimer, leaseMs, srid = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local itemKey = prefix .. srid
if redis.call('HGET', itemKey, 'status') ~= 'Pending' then return {} end
local token = claimQueueItem(pendingKey, claimedKey, itemKey, srid, claimer, leaseMs, (nowMs()))
return {srid, token, 0}
