--- @include "enqueueReady"
-- A step completed: decrement each dependent's counter; a dependent reaching
-- zero becomes ready. O(children). Returns the number of steps made ready.
local function releaseChildren(ek, step)
  local children = redis.call('HGET', ek.children, step)
  local n = 0
  if children then
    for child in string.gmatch(children, '[^,]+') do
      local left = redis.call('HINCRBY', ek.pending, child, -1)
      if left <= 0 and redis.call('HGET', ek.status, child) == 'pending' then
        enqueueReady(ek, child)
        n = n + 1
      end
    end
  end
  return n
end
