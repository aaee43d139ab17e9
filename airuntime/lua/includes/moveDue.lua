-- Make retry-due steps claimable again and return expired Running steps to Ready.
-- Recovery does not touch the attempt counter: a vanished worker is not a failed
-- attempt. Bounded by `limit` each; returns promoted, recovered.
local function moveDue(now, limit)
  local promoted = 0
  local due = redis.call('ZRANGEBYSCORE', delayedKey, '-inf', now, 'LIMIT', 0, limit)
  for _, step in ipairs(due) do
    redis.call('ZREM', delayedKey, step)
    enqueueReady(step)
    promoted = promoted + 1
  end
  local recovered = 0
  local expired = redis.call('ZRANGEBYSCORE', runningKey, '-inf', now, 'LIMIT', 0, limit)
  for _, step in ipairs(expired) do
    redis.call('ZREM', runningKey, step)
    local token = redis.call('HGET', tokenKey, step)
    redis.call('HDEL', tokenKey, step)
    enqueueReady(step)
    recovered = recovered + 1
    emit('type', 'step_recovered', 'step', step, 'token', token or '',
      'attempt', redis.call('HGET', attemptKey, step) or '1')
  end
  if recovered > 0 then
    redis.call('HINCRBY', metaKey, 'running', -recovered)
  end
  return promoted, recovered
end
