--[[
  The controller of a runtime instance starts the run at the head of its local queue:
  in one step the run leaves the queue and becomes running with its ExecutionId, but
  only if it is still queued and still this instance's. A run that was cancelled,
  adopted by another instance or removed meanwhile only leaves this queue.

  The controller looks at the head of the queue (LINDEX) instead of popping it, so a
  controller that dies between reading and starting loses nothing: the run is still
  queued, or already running with its ExecutionId (and resumed by reconciliation).

  Input:
    KEYS[1] the run's record (air:{air}:run:<RunId>)
    KEYS[2] the instance's local queue (air:{air}:instance:<id>:queue)
    KEYS[3] queued runs (air:{air}:runs:queued)
    KEYS[4] running runs (air:{air}:runs:running)
    ARGV[1] RunId
    ARGV[2] instance id (the caller)
    ARGV[3] ExecutionId to record

  Output:
    {1, startedAtMs}   started: status running, execution_id set, out of the queue
    {0, status}        not started ('missing' when the record is gone); the queue entry
                       was dropped
]]
--- @include "nowMs"

redis.call('LREM', KEYS[2], 0, ARGV[1])
local run = redis.call('HMGET', KEYS[1], 'status', 'instance_id')
if not run[1] then return {0, 'missing'} end
if run[1] ~= 'queued' or run[2] ~= ARGV[2] then return {0, run[1]} end
local now = nowMs()
redis.call('HSET', KEYS[1], 'status', 'running', 'execution_id', ARGV[3], 'started_at_ms', now)
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[4], now, ARGV[1])
return {1, now}
