--[[
  Complete an `input` step that is WaitingForInput with the value a person (or
  system) provided, release its dependents (at most a budget of them in this call,
  the rest in the calls that claim next: includes/releaseMany) and resume claims when
  no other input is awaited.

  Input:
    KEYS[1..21] the execution's keys
    KEYS[22] air:executions:active (of the execution's bucket) (finalizing removes the execution from it)
    KEYS[23] air:archive:outbox (of the execution's bucket) (finalizing queues the execution for the archiver)
    ARGV[1] step id
    ARGV[2] value JSON
    ARGV[3] actor (ledger only)

  Output:
    {-1} not found  {-2} step not found  {-6, status} finalized
    {-5, status} execution is cancelling
    {-4, stepStatus} step is not waiting for input
    {1, status}
]]
--- @include "execKeys"
--- @include "nowMs"
--- @include "emit"
--- @include "releaseMany"
--- @include "refreshStatus"
--- @include "finalize"
--- @include "finishRecord"

local ek = execKeys(KEYS)
if redis.call('EXISTS', ek.meta) == 0 then return {-1} end
local m = redis.call('HMGET', ek.meta, 'terminal', 'control', 'releasing')
local terminal = m[1]
if terminal and terminal ~= '' then return {-6, terminal} end
if m[2] == 'cancel' then return {-5, 'Cancelling'} end
local step = ARGV[1]
local st = redis.call('HGET', ek.status, step)
if not st then return {-2} end
if st ~= 'input_wait' then return {-4, st} end
local now = nowMs()
redis.call('HSET', ek.status, step, 'completed')
redis.call('HSET', ek.out, step, ARGV[2])
redis.call('HSET', ek.owner, step, finishRecord(now, ARGV[3]))
redis.call('HINCRBY', ek.meta, 'waiting_input', -1)
redis.call('HINCRBY', ek.meta, 'completed', 1)
redis.call('HINCRBY', ek.meta, 'done', 1)
emit(ek, 'type', 'input_provided', 'step', step, 'actor', ARGV[3])
releaseMany(ek, {step}, m[3])
local status, mayEnd = refreshStatus(ek)
local final = mayEnd and finalizeIfDone(ek, now)
return {1, final or status}
