--[[
  A tenant's model token budget: reserve tokens before a model call, settle them with
  what the call used, or read where the tenant stands. The budget is the tenant's
  `model_token_budget` setting ({"tokens": N, "window": "hour" | "day" | "month"}),
  read from its stored settings in this call, so a change applies to the next call on
  every runtime. Windows are calendar hours, days and months in UTC, by the server's
  clock (no runtime's clock decides when a budget renews); the usage hash holds the
  current window's id, the tokens used in it and the tokens reserved by calls still
  going on, and starts again at zero when a call finds another window.

  A reservation is refused when the tokens used and reserved in the window plus the
  ones asked for would pass the budget. A settle moves a reservation to `used` with the
  tokens the call reported; one of a window that has ended changes nothing (the new
  window started at zero). A reservation never settled (its runtime died during the
  call) stays counted until the window ends: the budget errs on the side of spending
  less.

  Input:
    KEYS[1] air:{air}:tenant:<id>:settings (string: the tenant's settings JSON)
    KEYS[2] air:{air}:tenant:<id>:model-tokens (hash: window, used, reserved)
    ARGV[1] 'reserve' | 'settle' | 'read'
    ARGV[2] reserve: tokens to reserve; settle: tokens the reservation holds
    ARGV[3] settle: tokens the call used
    ARGV[4] settle: the reservation's window id
    ARGV[5] the time in seconds since the epoch to judge the window by ('' or absent:
            the server's; given only by the tests of the calendar arithmetic)

  Output:
    reserve, read:
    {0}  the tenant has no budget (nothing is reserved or counted)
    {code, windowId, startS, endS, used, reserved, limit, window}
      code: 1 reserved (reserve) or read (read); -1 refused: used + reserved + asked
      would pass the limit (nothing changes)
    settle:
    1 settled, 0 the reservation's window has ended (nothing changes)
]]
--- @include "nowMs"

local op = ARGV[1]
local now = tonumber(ARGV[5] or '')
if not now then now = nowMs() / 1000 end
now = math.floor(now)

if op == 'settle' then
  if redis.call('HGET', KEYS[2], 'window') ~= ARGV[4] then return 0 end
  local held = tonumber(ARGV[2])
  local reserved = tonumber(redis.call('HGET', KEYS[2], 'reserved') or '0') - held
  if reserved < 0 then reserved = 0 end
  redis.call('HSET', KEYS[2], 'reserved', reserved)
  redis.call('HINCRBY', KEYS[2], 'used', tonumber(ARGV[3]))
  return 1
end

local raw = redis.call('GET', KEYS[1])
if not raw then return {0} end
local budget = cjson.decode(raw)['model_token_budget']
if type(budget) ~= 'table' then return {0} end
local limit = tonumber(budget['tokens'])
local kind = budget['window'] or 'day'
if not limit then return {0} end

-- Days since 1970-01-01 of a civil date, and the civil date of such a day (Howard
-- Hinnant's algorithms, proleptic Gregorian calendar).
local floor = math.floor
local function daysFromCivil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = floor(y / 400)
  local yoe = y - era * 400
  local mp = (m > 2) and (m - 3) or (m + 9)
  local doy = floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + floor(yoe / 4) - floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end
local function civilFromDays(z)
  z = z + 719468
  local era = floor(z / 146097)
  local doe = z - era * 146097
  local yoe = floor((doe - floor(doe / 1460) + floor(doe / 36524) - floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + floor(yoe / 4) - floor(yoe / 100))
  local mp = floor((5 * doy + 2) / 153)
  local m = (mp < 10) and (mp + 3) or (mp - 9)
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m
end

local startS, endS
if kind == 'hour' then
  startS = now - now % 3600
  endS = startS + 3600
elseif kind == 'month' then
  local y, m = civilFromDays(floor(now / 86400))
  startS = daysFromCivil(y, m, 1) * 86400
  if m == 12 then y, m = y + 1, 1 else m = m + 1 end
  endS = daysFromCivil(y, m, 1) * 86400
else
  kind = 'day'
  startS = now - now % 86400
  endS = startS + 86400
end
local windowId = kind .. ':' .. startS

local stored = redis.call('HMGET', KEYS[2], 'window', 'used', 'reserved')
local used, reserved = 0, 0
if stored[1] == windowId then
  used = tonumber(stored[2] or '0')
  reserved = tonumber(stored[3] or '0')
end
if op == 'read' then
  return {1, windowId, startS, endS, used, reserved, limit, kind}
end

local asked = tonumber(ARGV[2])
if used + reserved + asked > limit then
  return {-1, windowId, startS, endS, used, reserved, limit, kind}
end
reserved = reserved + asked
redis.call('HSET', KEYS[2], 'window', windowId, 'used', used, 'reserved', reserved)
-- Kept a day past its window, so a tenant that stops calling leaves nothing behind.
redis.call('EXPIREAT', KEYS[2], endS + 86400)
return {1, windowId, startS, endS, used, reserved, limit, kind}
