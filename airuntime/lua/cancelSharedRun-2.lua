--[[
  Cancel a shared-queue item that has not been dispatched: Pending or parked items
  leave the queue at once; a Claimed item is marked so its pump settles it as
  Cancelled instead of dispatching (the settle call then fails with -3 and the pump
  drops it).

  Input:
    KEYS[1] the tenant's pending zset (air:{q:<tenant>}:pending)
    KEYS[2] the tenant's claimed zset (air:{q:<tenant>}:claimed)
    ARGV[1] the tenant's item key prefix (air:{q:<tenant>}:item:)
    ARGV[2] SharedRunId

  Output:
    1 cancelled   0 already dispatched (cancel the runtime run instead)   -2 no such item
]]
local pendingKey, claimedKey = KEYS[1], KEYS[2]
local itemKey = ARGV[1] .. ARGV[2]
local status = redis.call('HGET', itemKey, 'status')
if not status then return -2 end
if status == 'Dispatched' then return 0 end
redis.call('ZREM', pendingKey, ARGV[2])
redis.call('ZREM', claimedKey, ARGV[2])
redis.call('HSET', itemKey, 'status', 'Cancelled')
redis.call('HDEL', itemKey, 'claim_token', 'claimed_by')
return 1
