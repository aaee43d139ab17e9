--[[
  Record running steps a worker stopped because their execution is being
  cancelled: the handler was interrupted, or never started (it was still waiting
  for a step slot), and produced nothing. Each stop must present the step's
  current claim token, so a stale worker changes nothing. A stopped step becomes
  `cancelled`, leaves the running set and loses its claim token, so a completion
  or failure that arrives later is rejected as stale (-3). When the last running
  step is stopped the execution finalizes Cancelled at once, instead of waiting
  for the running work to drain. Pause never stops steps (they drain), so this
  call is refused unless a cancel was requested.

  Input:
    KEYS[1..21] the execution's keys
    KEYS[22] air:executions:active (of the execution's bucket) (finalizing removes the execution from it)
    KEYS[23] air:archive:outbox (of the execution's bucket) (finalizing queues the execution for the archiver)
    ARGV[1] reason (ledger only)
    ARGV[2 + 3*(i-1) ..] per step: step id, claim token, worker id

  Output:
    {-1} execution not found
    {-6, terminalStatus} already finalized (nothing is running any more)
    {-4, status} no cancel requested
    {status, n, code_1, ..., code_n}
      status: execution status after the call (Cancelled if this call finalized)
      code_i: 1 stopped, -2 step not found, -3 stale claim token, -4 step not Running
]]
--- @include "execKeys"
--- @include "nowMs"
--- @include "emit"
--- @include "refreshStatus"
--- @include "finalize"
--- @include "finishRecord"

local ek = execKeys(KEYS)
if redis.call('EXISTS', ek.meta) == 0 then return {-1} end
local terminal = redis.call('HGET', ek.meta, 'terminal')
if terminal and terminal ~= '' then return {-6, terminal} end
if redis.call('HGET', ek.meta, 'control') ~= 'cancel' then return {-4, refreshStatus(ek)} end
local now = nowMs()
local reason = ARGV[1]
local result = {'', 0}
local stopped = 0
for i = 2, #ARGV, 3 do
  local step, token, worker = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local st = redis.call('HGET', ek.status, step)
  local code
  if not st then
    code = -2
  elseif redis.call('HGET', ek.token, step) ~= token then
    code = -3
  elseif st ~= 'running' then
    code = -4
  else
    code = 1
    stopped = stopped + 1
    redis.call('HSET', ek.status, step, 'cancelled')
    redis.call('HDEL', ek.token, step)
    redis.call('ZREM', ek.running, step)
    redis.call('HSET', ek.owner, step, finishRecord(now, worker))
    emit(ek, 'type', 'step_stopped', 'step', step, 'worker', worker, 'token', token,
      'attempt', redis.call('HGET', ek.attempt, step) or '1', 'reason', reason)
  end
  result[#result + 1] = code
end
if stopped > 0 then
  redis.call('HINCRBY', ek.meta, 'cancelled', stopped)
  redis.call('HINCRBY', ek.meta, 'done', stopped)
  redis.call('HINCRBY', ek.meta, 'running', -stopped)
end
local status, mayEnd = refreshStatus(ek)
local final = mayEnd and finalizeIfDone(ek, now)
result[1] = final or status
result[2] = #result - 2
return result
