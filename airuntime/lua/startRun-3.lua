--[[
  The controller of a runtime instance starts the run at the head of its local queue:
  in one step the run becomes running with its ExecutionId, but only if it is still
  queued and still this instance's. The caller then removes it from the local queue
  (another slot on a cluster) whatever the answer: a run that was cancelled, adopted
  by another instance or removed meanwhile only leaves the queue. A caller that dies
  in between leaves an entry of a run that is not queued, which the next look at the
  queue drops.

  The controller looks at the head of the queue (LINDEX) instead of popping it, so a
  controller that dies between reading and starting loses nothing: the run is still
  queued, or already running with its ExecutionId (and resumed by reconciliation).

  Input:
    KEYS[1] the run's record (<bucket>:run:<RunId>)
    KEYS[2] the bucket's queued runs (<bucket>:runs:queued)
    KEYS[3] the bucket's running runs (<bucket>:runs:running)
    ARGV[1] RunId
    ARGV[2] instance id (the caller)
    ARGV[3] ExecutionId to record
    ARGV[4] optional: a JSON object of metadata entries merged into the record's
            `metadata` (who runs it, with how many workers), so the start needs no
            second write

  Output:
    {1, startedAtMs}   started: status running, execution_id set (also to this very
                       call sent again after a lost reply: same instance, same new
                       ExecutionId; nothing written again)
    {0, status}        not started ('missing' when the record is gone)
]]
--- @include "nowMs"

local run = redis.call('HMGET', KEYS[1], 'status', 'instance_id', 'execution_id', 'started_at_ms')
if not run[1] then return {0, 'missing'} end
if run[1] == 'running' and run[2] == ARGV[2] and run[3] == ARGV[3] then
  -- This very start, sent again after its reply was lost (the ExecutionId is new for
  -- every start attempt, so nobody else wrote it): started, as the first call said.
  return {1, tonumber(run[4])}
end
if run[1] ~= 'queued' or run[2] ~= ARGV[2] then return {0, run[1]} end
local now = nowMs()
redis.call('HSET', KEYS[1], 'status', 'running', 'execution_id', ARGV[3], 'started_at_ms', now)
if ARGV[4] and ARGV[4] ~= '' then
  local raw = redis.call('HGET', KEYS[1], 'metadata')
  local merged = {}
  if raw then merged = cjson.decode(raw) end
  for k, v in pairs(cjson.decode(ARGV[4])) do merged[k] = v end
  redis.call('HSET', KEYS[1], 'metadata', cjson.encode(merged))
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], now, ARGV[1])
return {1, now}
