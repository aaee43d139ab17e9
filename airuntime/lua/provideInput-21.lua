--[[
  Complete an `input` step that is WaitingForInput with the value a person (or
  system) provided, release its dependents and resume claims when no other
  input is awaited.

  Input:
    KEYS[1..21] the execution's keys
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
--- @include "enqueueReady"
--- @include "releaseChildren"
--- @include "refreshStatus"
--- @include "finalize"

if redis.call('EXISTS', metaKey) == 0 then return {-1} end
local terminal = redis.call('HGET', metaKey, 'terminal')
if terminal and terminal ~= '' then return {-6, terminal} end
if redis.call('HGET', metaKey, 'control') == 'cancel' then return {-5, 'Cancelling'} end
local step = ARGV[1]
local st = redis.call('HGET', statusKey, step)
if not st then return {-2} end
if st ~= 'input_wait' then return {-4, st} end
local now = nowMs()
redis.call('HSET', statusKey, step, 'completed')
redis.call('HSET', outKey, step, ARGV[2])
redis.call('HSET', ownerKey, step, ARGV[3])
redis.call('HSET', timesKey, 'f:' .. step, now)
redis.call('HINCRBY', metaKey, 'waiting_input', -1)
redis.call('HINCRBY', metaKey, 'completed', 1)
redis.call('HINCRBY', metaKey, 'done', 1)
emit('type', 'input_provided', 'step', step, 'actor', ARGV[3])
releaseChildren(step)
local status = refreshStatus()
local final = finalizeIfDone(now)
return {1, final or status}
