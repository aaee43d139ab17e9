-- Milliseconds until the next retry becomes due or the next lease expires; -1 if none.
local function nextWake(ek, now)
  local best = -1
  local d = redis.call('ZRANGE', ek.delayed, 0, 0, 'WITHSCORES')
  if d[2] then best = tonumber(d[2]) end
  local r = redis.call('ZRANGE', ek.running, 0, 0, 'WITHSCORES')
  if r[2] and (best < 0 or tonumber(r[2]) < best) then best = tonumber(r[2]) end
  if best < 0 then return -1 end
  if best < now then return 0 end
  return best - now
end
