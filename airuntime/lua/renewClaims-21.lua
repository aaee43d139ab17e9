--[[
  Extend the leases of steps a worker is still executing. A step whose token no
  longer matches (recovered, finalized) is reported lost so the worker can stop it.

  Input:
    KEYS[1..21] the execution's keys
    ARGV[1] lease, milliseconds
    ARGV[2 + 2*(i-1) ..] per step: step id, claim token

  Output:
    {-1} execution not found
    {status, code_1, ..., code_n}   code_i: 1 renewed, 0 lost
]]
--- @include "execKeys"
--- @include "nowMs"

local ek = execKeys(KEYS)
if redis.call('EXISTS', ek.meta) == 0 then return {-1} end
local expiry = nowMs() + tonumber(ARGV[1])
local result = {redis.call('HGET', ek.meta, 'status')}
for i = 2, #ARGV, 2 do
  local step, token = ARGV[i], ARGV[i + 1]
  if redis.call('HGET', ek.status, step) == 'running' and redis.call('HGET', ek.token, step) == token then
    redis.call('ZADD', ek.running, 'XX', expiry, step)
    result[#result + 1] = 1
  else
    result[#result + 1] = 0
  end
end
return result
