--[[
  Pause, resume or cancel an execution. Pause and cancel block new claims at
  once; running steps drain (Pausing -> Paused when none is left; Cancelling ->
  Cancelled at finalization). Cancel is final and wins over a natural completion
  that has not been finalized yet.

  Input:
    KEYS[1..21] the execution's keys
    ARGV[1] action: pause | resume | cancel
    ARGV[2] actor / reason (ledger only)

  Output:
    {-1} not found   {-6, terminalStatus} already finalized
    {-4, status} action not allowed now (pause or resume while cancelling)
    {1, status}      status after the action (terminal if it finalized)
]]
--- @include "execKeys"
--- @include "nowMs"
--- @include "emit"
--- @include "refreshStatus"
--- @include "finalize"

local ek = execKeys(KEYS)
if redis.call('EXISTS', ek.meta) == 0 then return {-1} end
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
local status = refreshStatus(ek)
local final = finalizeIfDone(ek, now)
return {1, final or status}
