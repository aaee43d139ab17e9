--[[
  Move retry-due steps to Ready and return Running steps whose lease expired to
  Ready (attempt count unchanged: recovery is not a retry), then finalize if the
  execution became terminal (e.g. cancelled with no live claim left).

  Input:
    KEYS[1..21] the execution's keys
    KEYS[22] air:executions:active (of the execution's bucket) (finalizing removes the execution from it)
    KEYS[23] air:archive:outbox (of the execution's bucket) (finalizing queues the execution for the archiver)
    ARGV[1] maximum number of steps to move of each kind

  Output:
    {-1} execution not found
    {status, promoted, recovered, wakeMs}
]]
--- @include "execKeys"
--- @include "nowMs"
--- @include "moveDue"
--- @include "nextWake"
--- @include "refreshStatus"
--- @include "finalize"

local ek = execKeys(KEYS)
if redis.call('EXISTS', ek.meta) == 0 then return {-1} end
local terminal = redis.call('HGET', ek.meta, 'terminal')
if terminal and terminal ~= '' then return {terminal, 0, 0, -1} end
local now = nowMs()
local promoted, recovered = moveDue(ek, now, tonumber(ARGV[1]))
local status, mayEnd = refreshStatus(ek)
local final = mayEnd and finalizeIfDone(ek, now)
return {final or status, promoted, recovered, nextWake(ek, now)}
