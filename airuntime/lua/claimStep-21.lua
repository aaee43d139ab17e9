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
  (Ready implies every dependency completed: only such a step is ever made Ready, so
  its dependency counter is not read again -- it is not kept once it reaches zero,
  includes/releaseMany.)
]]
--- @include "execKeys"
--- @include "nowMs"
--- @include "markClaimed"
--- @include "refreshStatus"
--- @include "readOutputs"

local ek = execKeys(KEYS)
if redis.call('EXISTS', ek.meta) == 0 then return {-1} end
local owner = ARGV[1]
local step = ARGV[2]
local now = nowMs()
local terminal = redis.call('HGET', ek.meta, 'terminal')
if terminal and terminal ~= '' then return {-6, terminal} end
local status = refreshStatus(ek)
if status ~= 'Running' then return {-5, status} end
local st = redis.call('HGET', ek.status, step)
if not st then return {-2} end
if st ~= 'ready' then return {-4, st} end

redis.call('ZREM', ek.readyThrottled, step)
redis.call('ZREM', ek.ready, step)
local seq = redis.call('HINCRBY', ek.meta, 'claim_seq', 1)
local token = owner .. '#' .. seq
local attempt = markClaimed(ek, step, owner, token, now, now + tonumber(ARGV[3]), ARGV[4])
redis.call('HINCRBY', ek.meta, 'running', 1)
if seq == 1 then redis.call('HSETNX', ek.meta, 'started_at', now) end -- the first claim (includes/claimReady)
local result = {1, token, attempt}
readOutputs(ek, step, result)
return result
