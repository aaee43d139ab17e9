--[[
  Claim up to ARGV[4] of the oldest Pending shared-queue items for one pump, in queue
  order, skipping items of the tenants listed in ARGV[5..] (tenants that found no
  capacity earlier in this pump cycle; scans at most 1000 items). The batch form of
  claimSharedRun: one call per pump cycle instead of one per run. Items whose claim
  lease expired go back to Pending first, as in claimSharedRun.

  Input:
    KEYS[1] pending zset
    KEYS[2] claimed zset
    ARGV[1] item key prefix
    ARGV[2] claimer (pump identity)
    ARGV[3] claim lease, milliseconds
    ARGV[4] most items to claim (>= 1)
    ARGV[5..] tenant ids to skip

  Output:
    {recoveredCount, SharedRunId1, claimToken1, tenantId1, SharedRunId2, ...}
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
local skip = {}
for i = 5, #ARGV do skip[ARGV[i]] = true end
local scan = most
if #ARGV >= 5 then scan = 1000 end
local out = {recovered}
local taken = 0
for _, srid in ipairs(redis.call('ZRANGE', pendingKey, 0, scan - 1)) do
  if taken >= most then break end
  local tenant = redis.call('HGET', prefix .. srid, 'tenant_id') or ''
  if not skip[tenant] then
    local token = claimQueueItem(pendingKey, claimedKey, prefix .. srid, srid, claimer, leaseMs, now)
    out[#out + 1] = srid
    out[#out + 1] = token
    out[#out + 1] = tenant
    taken = taken + 1
  end
end
return out
