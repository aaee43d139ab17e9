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
  local names = {}
  for ref in string.gmatch(refs, '[^,]+') do names[#names + 1] = ref end
  result[#result + 1] = #names
  local outs = hmgetMany(ek.out, names)
  for k, ref in ipairs(names) do
    result[#result + 1] = ref
    result[#result + 1] = outs[k] or 'null'
  end
end

local function readOutputs(ek, step, result)
  readOutputsOf(ek, redis.call('HGET', ek.refs, step), result)
end
