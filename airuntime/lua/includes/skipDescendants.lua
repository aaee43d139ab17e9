--- @include "emit"
-- Failure policy "continue": a terminally failed step's descendants can never
-- run; mark them skipped (each step at most once, so O(descendants)).
local function skipDescendants(ek, step)
  local queue = {step}
  local head = 1
  local skipped = 0
  while head <= #queue do
    local s = queue[head]
    head = head + 1
    local children = redis.call('HGET', ek.children, s)
    if children then
      for child in string.gmatch(children, '[^,]+') do
        if redis.call('HGET', ek.status, child) == 'pending' then
          redis.call('HSET', ek.status, child, 'skipped')
          skipped = skipped + 1
          queue[#queue + 1] = child
          emit(ek, 'type', 'step_skipped', 'step', child, 'cause', step)
        end
      end
    end
  end
  if skipped > 0 then
    redis.call('HINCRBY', ek.meta, 'skipped', skipped)
    redis.call('HINCRBY', ek.meta, 'done', skipped)
  end
  return skipped
end
