--[[
  Finalize the execution if it is terminal. Safe to call any number of times from
  any number of workers: the terminal status, snapshot and `execution_finalized`
  ledger entry are written once.

  Input:
    KEYS[1..21] the execution's keys
    KEYS[22] air:executions:active (of the execution's bucket) (finalizing removes the execution from it)
    KEYS[23] air:archive:outbox (of the execution's bucket) (finalizing queues the execution for the archiver)

  Output:
    {-1} not found
    {1, terminalStatus}   finalized (now or before)
    {0, status}           not terminal yet
]]
--- @include "execKeys"
--- @include "nowMs"
--- @include "refreshStatus"
--- @include "finalize"

local ek = execKeys(KEYS)
if redis.call('EXISTS', ek.meta) == 0 then return {-1} end
local status, mayEnd = refreshStatus(ek)
local final = mayEnd and finalizeIfDone(ek, (nowMs()))
if final then return {1, final} end
return {0, status}
