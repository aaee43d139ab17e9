--[[
  Put back into one tenant's queue the claims whose lease ran out (their pump died
  between claim and settle), each Pending again at its original place; at most 100
  per call. The claim scripts do this too, for the tenant they claim from; the pumps
  call this one for a tenant with nothing Pending but an expired claim, which no claim
  would otherwise visit.

  Input:
    KEYS[1] the tenant's pending zset (air:{q:<tenant>}:pending)
    KEYS[2] the tenant's claimed zset (air:{q:<tenant>}:claimed)
    ARGV[1] the tenant's item key prefix (air:{q:<tenant>}:item:)

  Output:
    the number of claims put back
]]
--- @include "nowMs"
--- @include "recoverClaims"

local now, nowUs = nowMs()
return recoverClaims(KEYS[2], KEYS[1], ARGV[1], now, nowUs)
