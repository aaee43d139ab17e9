-- Put a step whose dependencies are all complete where it can be claimed:
-- the plain or throttled ready set (score = topological order), or, for an
-- `input` step, WaitingForInput (it is completed by provideInput, never claimed).
local function enqueueReady(step)
  local kind = redis.call('HGET', kindKey, step)
  if kind == 'i' then
    redis.call('HSET', statusKey, step, 'input_wait')
    redis.call('HINCRBY', metaKey, 'waiting_input', 1)
    emit('type', 'input_requested', 'step', step)
    return
  end
  local order = redis.call('HGET', orderKey, step)
  redis.call('HSET', statusKey, step, 'ready')
  if kind == 't' then
    redis.call('ZADD', readyThrottledKey, order, step)
  else
    redis.call('ZADD', readyKey, order, step)
  end
end
