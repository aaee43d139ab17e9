--- @include "emit"
-- Put a step whose dependencies are all complete where it can be claimed:
-- the plain or throttled ready set (score = topological order), or, for an
-- `input` step, WaitingForInput (it is completed by provideInput, never claimed).
local function enqueueReady(ek, step)
  local kind = redis.call('HGET', ek.kind, step)
  if kind == 'i' then
    redis.call('HSET', ek.status, step, 'input_wait')
    redis.call('HINCRBY', ek.meta, 'waiting_input', 1)
    emit(ek, 'type', 'input_requested', 'step', step)
    return
  end
  local order = redis.call('HGET', ek.order, step)
  redis.call('HSET', ek.status, step, 'ready')
  if kind == 't' then
    redis.call('ZADD', ek.readyThrottled, order, step)
  else
    redis.call('ZADD', ek.ready, order, step)
  end
end
