--[[
  Claim the oldest Pending item of one tenant's shared queue for one pump (the pump
  picks the tenant whose head is oldest, skipping tenants that found no capacity
  earlier in its cycle: SharedQueue.claim_next). Items whose claim lease expired (the
  pump died between claim and mark) go back to Pending first, so a dead pump never
  strands work; the runtime's SharedRunId idempotency makes the second delivery of
  such an item harmless.

  Input:
    KEYS[1] the tenant's pending zset (air:{q:<tenant>}:pending)
    KEYS[2] the tenant's claimed zset (air:{q:<tenant>}:claimed)
    ARGV[1] the tenant's item key prefix (air:{q:<tenant>}:item:)
    ARGV[2] claimer (pump identity)
    ARGV[3] claim lease, milliseconds

  Output:
    {}                         nothing pending
    {SharedRunId, claimToken, recoveredCount}
]]
--- @include "nowMs"
--- @include "claimQueueItem"
--- @include "recoverClaims"

local pendingKey, claimedKey = KEYS[1], KEYS[2]
local prefix, claimer, leaseMs = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now, nowUs = nowMs()
local recovered = recoverClaims(claimedKey, pendingKey, prefix, now, nowUs)
local srid = redis.call('ZRANGE', pendingKey, 0, 0)[1]
if not srid then return {} end
local token = claimQueueItem(pendingKey, claimedKey, prefix .. srid, srid, claimer, leaseMs, now)
return {srid, token, recovered}
