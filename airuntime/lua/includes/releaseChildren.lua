-- A step completed: decrement each dependent's counter; a dependent reaching
-- zero becomes ready. O(children). Returns the number of steps made ready.
local function releaseChildren(step)
  local children = redis.call('HGET', childrenKey, step)
  local n = 0
  if children then
    for child in string.gmatch(children, '[^,]+') do
      local left = redis.call('HINCRBY', pendingKey, child, -1)
      if left <= 0 and redis.call('HGET', statusKey, child) == 'pending' then
        enqueueReady(child)
        n = n + 1
      end
    end
  end
  return n
end
