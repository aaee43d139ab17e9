--[[
  Claim one specific ready step (the throttled path: the caller has already
  passed policy admission and holds a concurrency lease for the step's scope;
  if this claim fails the caller releases that lease at once).

  Input:
    KEYS[1..21] the execution's keys
    ARGV[1] owner (worker id)
    ARGV[2] step id
    ARGV[3] lease, milliseconds
    ARGV[4] concurrency lease holder id (recorded in the ledger)

  Output:
    {1, token, attempt, nrefs, (ref, outputJSON) * nrefs}
    {-1} execution not found      {-2} step not found
    {-5, status} claims blocked   {-6, status} execution terminal
    {-4, stepStatus} step not Ready (already claimed, waiting for retry, ...)
    {-8} dependencies incomplete
]]
--- @include "execKeys"
--- @include "nowMs"
--- @include "emit"
--- @include "enqueueReady"
--- @include "refreshStatus"
--- @include "readOutputs"

if redis.call('EXISTS', metaKey) == 0 then return {-1} end
local owner = ARGV[1]
local step = ARGV[2]
local now = nowMs()
local terminal = redis.call('HGET', metaKey, 'terminal')
if terminal and terminal ~= '' then return {-6, terminal} end
local status = refreshStatus()
if status ~= 'Running' then return {-5, status} end
local st = redis.call('HGET', statusKey, step)
if not st then return {-2} end
if st ~= 'ready' then return {-4, st} end
if tonumber(redis.call('HGET', pendingKey, step) or '0') > 0 then return {-8} end

redis.call('ZREM', readyThrottledKey, step)
redis.call('ZREM', readyKey, step)
local seq = redis.call('HINCRBY', metaKey, 'claim_seq', 1)
local token = owner .. '#' .. seq
local attempt = redis.call('HGET', attemptKey, step) or '1'
redis.call('HSET', statusKey, step, 'running')
redis.call('HSET', tokenKey, step, token)
redis.call('HSET', ownerKey, step, owner)
redis.call('HSET', timesKey, 'c:' .. step, now)
redis.call('ZADD', runningKey, now + tonumber(ARGV[3]), step)
redis.call('HINCRBY', metaKey, 'running', 1)
redis.call('HSETNX', metaKey, 'started_at', now)
emit('type', 'step_claimed', 'step', step, 'attempt', attempt, 'worker', owner, 'token', token,
  'lease', ARGV[4])
local result = {1, token, attempt}
readOutputs(step, result)
return result
