--[[
  A runtime run reached a terminal state: in one step mark its record finished, take it
  out of the state indexes, append its RunOutcome to its bucket's outcome stream (which
  the control plane reads to end the shared run), and start its
  retention: the record and the SharedRunId mapping expire after the retention, and
  the tenant index entry is listed for the sweep (RunIndex.prune) at the same time.
  Finishing is idempotent: a run already terminal is left as it is and gets no second
  outcome. Every key is in the run's bucket; the caller then removes a run that was
  queued from its instance's local queue (another slot on a cluster; an entry left
  behind by a crash in between names a finished run, which the controller drops).

  Input:
    KEYS[1] the run's record (<bucket>:run:<RunId>)
    KEYS[2] the bucket's queued runs (<bucket>:runs:queued)
    KEYS[3] the bucket's running runs (<bucket>:runs:running)
    KEYS[4] the bucket's outcome stream (<bucket>:run-outcomes)
    KEYS[5] the run's SharedRunId -> RunId mapping (<bucket>:shared-run:<SharedRunId>)
    KEYS[6] the bucket's runs waiting for the retention sweep (<bucket>:runs:retention)
    (<bucket> = air:{air} on a standalone server, air:{rb:<b>:<n>} on a cluster)
    ARGV[1] RunId
    ARGV[2] terminal status: completed | failed | cancelled
    ARGV[3] failure reason ('' = none)
    ARGV[4] ExecutionId ('' = keep the recorded one)
    ARGV[5] step-slot evidence JSON ('' = none)
    ARGV[6] retention, seconds (> 0)
    ARGV[7] approximate cap of the outcome stream (MAXLEN ~)
    ARGV[8] status the run must be in ('' = any non-terminal; 'queued' for a cancel
            before start, so a run the controller started meanwhile is left alone)

  Output:
    {1, finishedAtMs, previousStatus}  finished now; the outcome was appended
    {0, status}        not finished: already terminal, or not in ARGV[8]
    {2}                no such run
]]
--- @include "nowMs"

local runKey = KEYS[1]
local f = redis.call('HMGET', runKey, 'status', 'shared_run_id', 'tenant_id', 'instance_id',
  'execution_id')
local status = f[1]
if not status then return {2} end
if status == 'completed' or status == 'failed' or status == 'cancelled' then
  return {0, status}
end
if ARGV[8] ~= '' and status ~= ARGV[8] then return {0, status} end

local now = nowMs()
local eid = ARGV[4]
if eid == '' then eid = f[5] or '' end
redis.call('HSET', runKey, 'status', ARGV[2], 'finished_at_ms', now)
if eid ~= '' then redis.call('HSET', runKey, 'execution_id', eid) end
if ARGV[3] ~= '' then redis.call('HSET', runKey, 'failure_reason', ARGV[3]) end
if ARGV[5] ~= '' then redis.call('HSET', runKey, 'step_slots', ARGV[5]) end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[7], '*',
  'run_id', ARGV[1],
  'shared_run_id', f[2] or '',
  'tenant_id', f[3] or '',
  'instance_id', f[4] or '',
  'status', ARGV[2],
  'execution_id', eid,
  'reason', ARGV[3],
  'finished_at_ms', now)
local retention = tonumber(ARGV[6])
redis.call('EXPIRE', runKey, retention)
redis.call('EXPIRE', KEYS[5], retention)
redis.call('ZADD', KEYS[6], now + retention * 1000, (f[3] or '') .. ':' .. ARGV[1])
return {1, now, status}
