--[[
  Pause, resume or cancel an execution. Pause and cancel block new claims at
  once. Under pause running steps drain (Pausing -> Paused when none is left).
  Under cancel the workers stop their running steps and record them with
  stopSteps (Cancelling -> Cancelled once none is running; a worker that never
  hears of it loses its lease and the step is settled at finalization). Cancel is
  final and wins over a natural completion that has not been finalized yet.
  Every accepted action PUBLISHes the execution id on the control channel so the
  workers of the execution react at once.
  A run record names its ExecutionId from the run's start on, a moment before its
  runtime creates the execution: a cancel that comes through the record in that
  window (ARGV[4] = its id) is kept in the early-cancel set and createExecution creates
  the execution cancelled, so the cancel is not lost.

  Input:
    KEYS[1..21] the execution's keys
    KEYS[22] air:executions:active (of the execution's bucket) (finalizing removes the execution from it)
    KEYS[23] air:archive:outbox (of the execution's bucket) (finalizing queues the execution for the archiver)
    KEYS[24] air:executions (of the execution's bucket) (not written: the key order of createExecution)
    KEYS[25] air:early-cancels (of the execution's bucket) (zset: id -> ms)
    ARGV[1] action: pause | resume | cancel
    ARGV[2] actor / reason (ledger only)
    ARGV[3] control channel (airuntime.core.keys.control_channel(); '' = no notice)
    ARGV[4] the execution id: a cancel of an execution that does not exist yet is
            kept for its creation (the id comes from a run record); '' = not found

  Output:
    {-1} not found   {-6, terminalStatus} already finalized
    {2}  the execution does not exist yet; the cancel is kept for its creation
         (entries older than a day are trimmed: their execution never came)
    {-4, status} action not allowed now (pause or resume while cancelling)
    {1, status}      status after the action (terminal if it finalized)
]]
--- @include "execKeys"
--- @include "nowMs"
--- @include "emit"
--- @include "refreshStatus"
--- @include "finalize"

local ek = execKeys(KEYS)
if redis.call('EXISTS', ek.meta) == 0 then
  if ARGV[1] ~= 'cancel' or not ARGV[4] or ARGV[4] == '' then return {-1} end
  local now = nowMs()
  redis.call('ZREMRANGEBYSCORE', ek.earlyCancels, '-inf', now - 86400000)
  redis.call('ZADD', ek.earlyCancels, 'NX', now, ARGV[4])
  return {2}
end
local terminal = redis.call('HGET', ek.meta, 'terminal')
if terminal and terminal ~= '' then return {-6, terminal} end
local action, actor = ARGV[1], ARGV[2]
local control = redis.call('HGET', ek.meta, 'control')
local now = nowMs()
if action == 'cancel' then
  if control ~= 'cancel' then
    redis.call('HSET', ek.meta, 'control', 'cancel', 'cancel_requested_at', now)
    emit(ek, 'type', 'cancel_requested', 'actor', actor)
  end
elseif action == 'pause' then
  if control == 'cancel' then return {-4, refreshStatus(ek)} end
  if control ~= 'pause' then
    redis.call('HSET', ek.meta, 'control', 'pause')
    emit(ek, 'type', 'execution_paused', 'actor', actor)
  end
elseif action == 'resume' then
  if control == 'cancel' then return {-4, refreshStatus(ek)} end
  if control == 'pause' then
    redis.call('HDEL', ek.meta, 'control')
    emit(ek, 'type', 'execution_resumed', 'actor', actor)
  end
else
  return redis.error_reply('unknown control action ' .. tostring(action))
end
local status, mayEnd = refreshStatus(ek)
local final = mayEnd and finalizeIfDone(ek, now)
if ARGV[3] and ARGV[3] ~= '' then
  redis.call('PUBLISH', ARGV[3], redis.call('HGET', ek.meta, 'execution_id'))
end
return {1, final or status}
