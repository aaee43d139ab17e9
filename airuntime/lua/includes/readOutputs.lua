--- @include "bulk"
-- Append, for each step a claimed step's inputs reference, its id and output JSON:
-- readOutputsOf takes the step's `refs` field (comma-separated ids, or false: none),
-- readOutputs reads it first. HMGET in chunks (bulk), so a fan-in over many
-- thousands of steps stays under Lua's stack limit.
local function readOutputsOf(ek, refs, result)
  if not refs then
    result[#result + 1] = 0
    return
  end
  local names, n = {}, 0
  for ref in string.gmatch(refs, '[^,]+') do
    n = n + 1
    names[n] = ref
  end
  local r = #result + 1
  result[r] = n
  local outs = hmgetMany(ek.out, names)
  -- Appended by index (a fan-in reads thousands: no `#` per element).
  for k = 1, n do
    result[r + 1] = names[k]
    result[r + 2] = outs[k] or 'null'
    r = r + 2
  end
end

local function readOutputs(ek, step, result)
  readOutputsOf(ek, redis.call('HGET', ek.refs, step), result)
end
