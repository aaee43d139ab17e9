--[[
  Move retry-due steps to Ready and return Running steps whose lease expired to
  Ready (attempt count unchanged: recovery is not a retry), then finalize if the
  execution became terminal (e.g. cancelled with no live claim left).

  Input:
    KEYS[1..21] the execution's keys
    ARGV[1] maximum number of steps to move of each kind

  Output:
    {-1} execution not found
    {status, promoted, recovered, wakeMs}
]]
--- @include "execKeys"
--- @include "nowMs"
--- @include "emit"
--- @include "enqueueReady"
--- @include "moveDue"
--- @include "nextWake"
--- @include "refreshStatus"
--- @include "finalize"

if redis.call('EXISTS', metaKey) == 0 then return {-1} end
local terminal = redis.call('HGET', metaKey, 'terminal')
if terminal and terminal ~= '' then return {terminal, 0, 0, -1} end
local now = nowMs()
local promoted, recovered = moveDue(now, tonumber(ARGV[1]))
local status = refreshStatus()
local final = finalizeIfDone(now)
return {final or status, promoted, recovered, nextWake(now)}
