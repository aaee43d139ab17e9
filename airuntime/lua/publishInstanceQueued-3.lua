--[[
  publishInstance-2 for an instance whose local queue shares the descriptor's slot (a
  standalone server): the descriptor was computed with a guess of the queue's length
  (the length the last publication found), and it is published only if the queue
  still has that length, so no descriptor naming a wrong queue length is ever
  written; otherwise nothing is written and the caller computes it again with the
  length returned. The length read and the publication are one round trip when the
  guess holds (a run that came and went between two publications leaves it as it was).

  Input:
    KEYS[1] the instance's descriptor (air:{air}:instance:<id>)
    KEYS[2] the instance index (air:{air}:instances, score = heartbeat expiry ms)
    KEYS[3] the instance's local queue (air:{air}:instance:<id>:queue)
    ARGV[1..3] as publishInstance-2
    ARGV[4] the queue length the descriptor was computed with

  Output:
    {1, nowMs}   published (the queue had that length)
    {0, length}  not published: the queue's length now
]]
--- @include "publishDescriptor"

local length = redis.call('LLEN', KEYS[3])
if length ~= tonumber(ARGV[4]) then return {0, length} end
return {1, publishDescriptor(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])}
