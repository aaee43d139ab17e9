-- Claim one shared-queue item for a pump: out of the pending zset, status Claimed with
-- a fresh claim token (`<claimer>#<n>`), and into the claimed zset until
-- now + leaseMs. Returns the claim token.
local function claimQueueItem(pendingKey, claimedKey, itemKey, srid, claimer, leaseMs, now)
  redis.call('ZREM', pendingKey, srid)
  local token = claimer .. '#' .. redis.call('HINCRBY', itemKey, 'claims', 1)
  redis.call('HSET', itemKey, 'status', 'Claimed', 'claim_token', token, 'claimed_by', claimer,
    'claimed_at_ms', now)
  redis.call('ZADD', claimedKey, now + leaseMs, srid)
  return token
end
