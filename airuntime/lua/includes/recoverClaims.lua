-- Put back into the queue the claims whose lease ran out (their pump died between claim
-- and settle): at most 100 per call, each Pending again at its original score. Returns
-- how many were recovered.
local function recoverClaims(claimedKey, pendingKey, prefix, now, nowUs)
  local recovered = 0
  local expired = redis.call('ZRANGEBYSCORE', claimedKey, '-inf', now, 'LIMIT', 0, 100)
  for _, srid in ipairs(expired) do
    redis.call('ZREM', claimedKey, srid)
    if redis.call('HGET', prefix .. srid, 'status') == 'Claimed' then
      redis.call('HSET', prefix .. srid, 'status', 'Pending')
      redis.call('HDEL', prefix .. srid, 'claim_token', 'claimed_by')
      redis.call('ZADD', pendingKey, redis.call('HGET', prefix .. srid, 'score') or nowUs, srid)
      recovered = recovered + 1
    end
  end
  return recovered
end
