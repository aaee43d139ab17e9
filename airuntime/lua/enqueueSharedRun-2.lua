--[[
  Put a shared run into the shared queue as a Pending item (FIFO by enqueue time).
  Idempotent: a Pending or Claimed item stays as it is. A Dispatched, Cancelled or
  ScaleOutRequested item is enqueued again only when ARGV[3] = '1' (requeue after
  scale-out fulfilment).

  A tenant's queue keys share the hash tag {q:<tenant>}; item keys are built from
  ARGV[1] inside that tag (one slot, Redis-Cluster safe). The caller announces the
  tenant in the tenant index (air:{air}:squeue:tenants) after this call.

  Input:
    KEYS[1] pending zset   (air:{q:<tenant>}:pending, score = enqueue time in microseconds)
    KEYS[2] claimed zset   (air:{q:<tenant>}:claimed, score = claim lease expiry ms)
    ARGV[1] item key prefix (air:{q:<tenant>}:item:)
    ARGV[2] SharedRunId
    ARGV[3] '1' to requeue an item that left the queue, '0' otherwise
    ARGV[4] tenant id

  Output:
    1 enqueued   0 already queued (no change)   -6 item is terminal and requeue not asked
]]
--- @include "nowMs"
--- @include "putPending"

local pendingKey, claimedKey = KEYS[1], KEYS[2]
local itemKey = ARGV[1] .. ARGV[2]
local now, nowUs = nowMs()
local status = redis.call('HGET', itemKey, 'status')
if status == 'Pending' or status == 'Claimed' then return 0 end
if status and ARGV[3] ~= '1' then return -6 end
putPending(pendingKey, itemKey, ARGV[2], ARGV[4], now, nowUs)
return 1
