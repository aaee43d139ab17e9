--- @include "emit"
--- @include "enqueueReady"
-- Make retry-due steps claimable again and return expired Running steps to Ready.
-- Recovery does not touch the attempt counter: a vanished worker is not a failed
-- attempt. Bounded by `limit` each; returns promoted, recovered.
local function moveDue(ek, now, limit)
  local promoted = 0
  local due = redis.call('ZRANGEBYSCORE', ek.delayed, '-inf', now, 'LIMIT', 0, limit)
  for _, step in ipairs(due) do
    redis.call('ZREM', ek.delayed, step)
    enqueueReady(ek, step)
    promoted = promoted + 1
  end
  local recovered = 0
  local expired = redis.call('ZRANGEBYSCORE', ek.running, '-inf', now, 'LIMIT', 0, limit)
  for _, step in ipairs(expired) do
    redis.call('ZREM', ek.running, step)
    local token = redis.call('HGET', ek.token, step)
    redis.call('HDEL', ek.token, step)
    -- The claim ended unfinished: its owner (the token's prefix) becomes the step's
    -- finish record without a time (includes/finishRecord), so a step cancelled or
    -- skipped before it runs again still names who had it.
    local owner = token and string.match(token, '^(.*)#%d+$')
    if owner then redis.call('HSET', ek.owner, step, owner) end
    enqueueReady(ek, step)
    recovered = recovered + 1
    emit(ek, 'type', 'step_recovered', 'step', step, 'token', token or '',
      'attempt', redis.call('HGET', ek.attempt, step) or '1')
  end
  if recovered > 0 then
    redis.call('HINCRBY', ek.meta, 'running', -recovered)
  end
  return promoted, recovered
end
