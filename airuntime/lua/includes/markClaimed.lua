--- @include "emit"
-- Make a Ready step Running for `owner` under claim `token` (`<owner>#<seq>`: the
-- token names the owner, no owner field is written), its lease expiring at
-- `expiry`, and record the claim in the ledger (with the concurrency lease holder for
-- a throttled claim). Returns the attempt. The caller takes the step out of its ready
-- set and counts it in meta.running.
local function markClaimed(ek, step, owner, token, now, expiry, leaseHolder)
  local attempt = redis.call('HGET', ek.attempt, step) or '1'
  redis.call('HSET', ek.status, step, 'running')
  redis.call('HSET', ek.token, step, token)
  redis.call('HSET', ek.times, 'c:' .. step, now)
  redis.call('ZADD', ek.running, expiry, step)
  if leaseHolder then
    emit(ek, 'type', 'step_claimed', 'step', step, 'attempt', attempt, 'worker', owner,
      'token', token, 'lease', leaseHolder)
  else
    emit(ek, 'type', 'step_claimed', 'step', step, 'attempt', attempt, 'worker', owner,
      'token', token)
  end
  return attempt
end
