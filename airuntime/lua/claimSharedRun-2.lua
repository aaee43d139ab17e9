--[[
  Claim the oldest Pending shared-queue item for one pump, skipping items of the
  tenants listed in ARGV[4..] (tenants that found no capacity earlier in this pump
  cycle: no head-of-line blocking across tenants; scans at most 1000 items). Items
  whose claim lease expired (the pump died between claim and mark) go back to
  Pending first, so a dead pump never strands work; the runtime's SharedRunId
  idempotency makes the second delivery of such an item harmless.

  Input:
    KEYS[1] pending zset
    KEYS[2] claimed zset
    ARGV[1] item key prefix
    ARGV[2] claimer (pump identity)
    ARGV[3] claim lease, milliseconds
    ARGV[4..] tenant ids to skip

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
local skip = {}
for i = 4, #ARGV do skip[ARGV[i]] = true end
local srid = nil
if #ARGV < 4 then
  local head = redis.call('ZRANGE', pendingKey, 0, 0)
  srid = head[1]
else
  for _, candidate in ipairs(redis.call('ZRANGE', pendingKey, 0, 999)) do
    if not skip[redis.call('HGET', prefix .. candidate, 'tenant_id') or ''] then
      srid = candidate
      break
    end
  end
end
if not srid then return {} end
local token = claimQueueItem(pendingKey, claimedKey, prefix .. srid, srid, claimer, leaseMs, now)
return {srid, token, recovered}
