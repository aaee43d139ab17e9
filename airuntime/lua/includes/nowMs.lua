-- Server time (never a client clock) in milliseconds and, as a second result from
-- the same TIME call, in microseconds (for scores finer than a millisecond).
local function nowMs()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end
