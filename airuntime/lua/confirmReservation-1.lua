--[[
  The runtime accepted the run a reservation was taken for: from now on the next
  descriptor the instance publishes reflects the run, so the reservation counts only
  until then. Its score becomes (now - grace), which reserveSlot treats as reflected
  by any descriptor published after now. A reservation already gone stays gone.

  Input:
    KEYS[1] the instance's reservations zset (air:{r:<instance>}:reservations)
    ARGV[1] the reservation's member ('<id>|<workers>')
    ARGV[2] grace, ms (the one reserveSlot is called with)

  Output:
    1 confirmed   0 no such reservation (expired or released)
]]
--- @include "nowMs"

local now = nowMs()
return redis.call('ZADD', KEYS[1], 'XX', 'CH', now - tonumber(ARGV[2]), ARGV[1])
