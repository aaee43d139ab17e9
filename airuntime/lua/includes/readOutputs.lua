-- Append, for each step the given step's inputs reference, its id and output JSON
-- (HMGET in chunks so a fan-in over many thousands of steps stays under Lua's stack limit).
local function readOutputs(ek, step, result)
  local refs = redis.call('HGET', ek.refs, step)
  if not refs then
    result[#result + 1] = 0
    return
  end
  local names = {}
  for ref in string.gmatch(refs, '[^,]+') do names[#names + 1] = ref end
  result[#result + 1] = #names
  local i = 1
  while i <= #names do
    local chunk = {}
    for j = i, math.min(i + 999, #names) do chunk[#chunk + 1] = names[j] end
    local outs = redis.call('HMGET', ek.out, unpack(chunk))
    for k, ref in ipairs(chunk) do
      result[#result + 1] = ref
      result[#result + 1] = outs[k] or 'null'
    end
    i = i + 1000
  end
end
