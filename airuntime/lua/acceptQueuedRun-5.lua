--[[
  Accept a run for a runtime instance and push it on the instance's local queue, in
  one step: acceptRun-4 for a standalone server, where the local queue shares the
  run's slot (air:{air}). Idempotent by SharedRunId like acceptRun-4; the room is read
  here, so concurrent accepts on one instance never overshoot its queue capacity, and
  there is no window between the record and the queue entry.

  Input:
    KEYS[1..4] as acceptRun-4 (mapping, record, tenant index, queued index)
    KEYS[5] the instance's local queue (air:{air}:instance:<ARGV[3]>:queue)
    ARGV[1..8] as acceptRun-4 (RunId, SharedRunId, instance, tenant, group, snapshot,
               metadata, request JSON)
    ARGV[9] the local queue's capacity: no acceptance once it holds this many runs

  Output:
    {1, runId, createdAtMs}  created and queued
    {0, runId}               the SharedRunId already has this run; nothing written
    {2}                      the local queue is full; nothing written
]]
--- @include "nowMs"
--- @include "acceptRunRecord"

local room = redis.call('LLEN', KEYS[5]) < tonumber(ARGV[9])
local reply = acceptRunRecord(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV, room)
if reply[1] == 1 then redis.call('RPUSH', KEYS[5], reply[2]) end
return reply
