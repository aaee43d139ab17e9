-- Failure policy "continue": a terminally failed step's descendants can never
-- run; mark them skipped (each step at most once, so O(descendants)).
local function skipDescendants(step)
  local queue = {step}
  local head = 1
  local skipped = 0
  while head <= #queue do
    local s = queue[head]
    head = head + 1
    local children = redis.call('HGET', childrenKey, s)
    if children then
      for child in string.gmatch(children, '[^,]+') do
        if redis.call('HGET', statusKey, child) == 'pending' then
          redis.call('HSET', statusKey, child, 'skipped')
          skipped = skipped + 1
          queue[#queue + 1] = child
          emit('type', 'step_skipped', 'step', child, 'cause', step)
        end
      end
    end
  end
  if skipped > 0 then
    redis.call('HINCRBY', metaKey, 'skipped', skipped)
    redis.call('HINCRBY', metaKey, 'done', skipped)
  end
  return skipped
end
