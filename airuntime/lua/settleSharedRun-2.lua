--[[
  Settle a claimed shared-queue item after a dispatch attempt: mark it Dispatched
  (the runtime accepted the run) or return it to Pending (dispatch failed; it keeps
  its original place in the queue), or park it (ScaleOutRequested / Rejected /
  Cancelled). Requires the claim token: a pump whose claim expired and was recovered
  cannot settle an item another pump now owns.

  Input:
    KEYS[1] the tenant's pending zset (air:{q:<tenant>}:pending)
    KEYS[2] the tenant's claimed zset (air:{q:<tenant>}:claimed)
    ARGV[1] the tenant's item key prefix (air:{q:<tenant>}:item:)
    ARGV[2] SharedRunId
    ARGV[3] claim token
    ARGV[4] outcome: Dispatched | Pending | ScaleOutRequested | Rejected | Cancelled
    ARGV[5] detail (instance id or reason)
    ARGV[6] optional: '0' when a Pending item was claimed but never tried (a pump's
            batch released it): its failed_dispatches count stays

  Output:
    1 settled   -3 stale claim token   -2 no such item
]]
--- @include "nowMs"

local pendingKey, claimedKey = KEYS[1], KEYS[2]
local itemKey = ARGV[1] .. ARGV[2]
local status = redis.call('HGET', itemKey, 'status')
if not status then return -2 end
if status ~= 'Claimed' or redis.call('HGET', itemKey, 'claim_token') ~= ARGV[3] then return -3 end
redis.call('ZREM', claimedKey, ARGV[2])
local outcome = ARGV[4]
local now, nowUs = nowMs()
if outcome == 'Pending' then
  -- back in its original place (FIFO by first enqueue)
  local score = redis.call('HGET', itemKey, 'score') or nowUs
  redis.call('ZADD', pendingKey, score, ARGV[2])
  if ARGV[6] ~= '0' then redis.call('HINCRBY', itemKey, 'failed_dispatches', 1) end
end
redis.call('HSET', itemKey, 'status', outcome, 'settled_at_ms', now, 'detail', ARGV[5])
redis.call('HDEL', itemKey, 'claim_token', 'claimed_by')
return 1
