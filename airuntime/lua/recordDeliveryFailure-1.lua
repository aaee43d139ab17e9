--[[
  Count one failed delivery to a runtime instance. After `threshold` consecutive
  failures the instance becomes suspect: the counter starts again, the number of
  suspicions grows, and the suspicion lasts initial * 2^(suspicions - 1) ms, capped.
  The record outlives the suspicion by `memory` ms, so an instance that fails again
  soon after is suspected for longer; a success deletes it (the caller's DEL).

  Input:
    KEYS[1] the instance's delivery-failure hash (air:delivery-failures:<instance>)
    ARGV[1] threshold: consecutive failures that make the instance suspect
    ARGV[2] first suspicion, ms
    ARGV[3] longest suspicion, ms
    ARGV[4] memory, ms: how long the record outlives the last failure or suspicion

  Output:
    {consecutiveFailures, suspicions, suspectForMs}   suspectForMs 0: not suspect (yet)
]]

local key = KEYS[1]
local threshold, initial, cap, memory =
  tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local failures = redis.call('HINCRBY', key, 'consecutive', 1)
local suspicions = tonumber(redis.call('HGET', key, 'suspicions') or '0')
local suspectFor = 0
if failures >= threshold then
  suspicions = redis.call('HINCRBY', key, 'suspicions', 1)
  redis.call('HSET', key, 'consecutive', 0)
  suspectFor = math.min(cap, initial * 2 ^ math.min(suspicions - 1, 30))
end
redis.call('PEXPIRE', key, memory + suspectFor)
return {failures, suspicions, suspectFor}
