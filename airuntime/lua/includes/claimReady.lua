-- Pop up to `want` steps from the plain ready set and claim them for `owner`:
-- status Running, a fresh claim token, lease expiry in the running set, a
-- `step_claimed` ledger entry. Appends [step, token, attempt, nrefs, refs...] per
-- claim to `result` and returns the number claimed.
local function claimReady(owner, want, leaseMs, now, result)
  if want <= 0 then return 0 end
  local popped = redis.call('ZPOPMIN', readyKey, want)
  if #popped == 0 then return 0 end
  local claimed = 0
  local seq = redis.call('HINCRBY', metaKey, 'claim_seq', #popped / 2)
  local first = seq - #popped / 2
  local expiry = now + leaseMs
  for i = 1, #popped, 2 do
    local step = popped[i]
    -- Defensive: a member of the ready set must be Ready with no open dependency.
    if redis.call('HGET', statusKey, step) == 'ready'
        and tonumber(redis.call('HGET', pendingKey, step) or '0') <= 0 then
      claimed = claimed + 1
      local token = owner .. '#' .. (first + (i + 1) / 2)
      local attempt = redis.call('HGET', attemptKey, step) or '1'
      redis.call('HSET', statusKey, step, 'running')
      redis.call('HSET', tokenKey, step, token)
      redis.call('HSET', ownerKey, step, owner)
      redis.call('HSET', timesKey, 'c:' .. step, now)
      redis.call('ZADD', runningKey, expiry, step)
      emit('type', 'step_claimed', 'step', step, 'attempt', attempt, 'worker', owner, 'token', token)
      result[#result + 1] = step
      result[#result + 1] = token
      result[#result + 1] = attempt
      readOutputs(step, result)
    end
  end
  if claimed > 0 then
    redis.call('HINCRBY', metaKey, 'running', claimed)
    redis.call('HSETNX', metaKey, 'started_at', now)
  end
  return claimed
end
