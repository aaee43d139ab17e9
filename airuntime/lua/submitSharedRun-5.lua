--[[
  Submit a shared run in one step (QueueFirst): its record, already QueuedGlobally, its
  index entries (all runs, its tenant's runs, open runs) and its Pending queue item.
  Nothing is half-written, so no cancel can land between the record and the queueing.
  The record and the queue live on one Redis (the shared-run indexes and the
  {squeue} keys are in different hash slots, as the run index's keys are).

  Input:
    KEYS[1] the run's record (air:srun:<SharedRunId>)
    KEYS[2] all shared runs zset (air:sruns)
    KEYS[3] the tenant's shared runs zset (air:sruns:tenant:<tenant>)
    KEYS[4] open shared runs zset (air:sruns:open)
    KEYS[5] shared queue pending zset
    ARGV[1] queue item key prefix
    ARGV[2] SharedRunId
    ARGV[3] tenant id
    ARGV[4] the record (JSON, status QueuedGlobally)
    ARGV[5] created_at_ms (the record's; the index score)

  Output:
    1 submitted   -1 the SharedRunId exists already (nothing written)
]]
--- @include "nowMs"
--- @include "putPending"

if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end
local now, nowUs = nowMs()
redis.call('SET', KEYS[1], ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[2])
redis.call('ZADD', KEYS[4], ARGV[5], ARGV[2])
putPending(KEYS[5], ARGV[1] .. ARGV[2], ARGV[2], ARGV[3], now, nowUs)
return 1
