--- @include "markClaimed"
--- @include "readOutputs"
-- Pop up to `want` steps from the plain ready set and claim them for `owner`:
-- status Running, a fresh claim token, lease expiry in the running set, a
-- `step_claimed` ledger entry. Appends [step, token, attempt, nrefs, refs...] per
-- claim to `result` and returns the number claimed.
local function claimReady(ek, owner, want, leaseMs, now, result)
  if want <= 0 then return 0 end
  local popped = redis.call('ZPOPMIN', ek.ready, want)
  if #popped == 0 then return 0 end
  local claimed = 0
  local seq = redis.call('HINCRBY', ek.meta, 'claim_seq', #popped / 2)
  local first = seq - #popped / 2
  local expiry = now + leaseMs
  for i = 1, #popped, 2 do
    local step = popped[i]
    -- Defensive: a member of the ready set must be Ready with no open dependency.
    if redis.call('HGET', ek.status, step) == 'ready'
        and tonumber(redis.call('HGET', ek.pending, step) or '0') <= 0 then
      claimed = claimed + 1
      local token = owner .. '#' .. (first + (i + 1) / 2)
      local attempt = markClaimed(ek, step, owner, token, now, expiry)
      result[#result + 1] = step
      result[#result + 1] = token
      result[#result + 1] = attempt
      readOutputs(ek, step, result)
    end
  end
  if claimed > 0 then
    redis.call('HINCRBY', ek.meta, 'running', claimed)
    redis.call('HSETNX', ek.meta, 'started_at', now)
  end
  return claimed
end
