--- @include "bulk"
--- @include "emit"
-- Steps completed: decrement each dependent's counter once per completed parent and
-- make the dependents that reach zero (and are still pending) ready -- the plain or
-- throttled ready set (score = topological order), or WaitingForInput for an `input`
-- step. O(children) work in a fixed number of commands (bulk) per call. Returns the
-- number of steps made ready (input steps included).
local function enqueueMany(ek, steps)
  local statuses = hmgetMany(ek.status, steps)
  local cand = {}
  for i, step in ipairs(steps) do
    if statuses[i] == 'pending' then cand[#cand + 1] = step end
  end
  if #cand == 0 then return 0 end
  -- Most plans have no throttled or input step: then there is no kind hash to read.
  local kinds = {}
  if redis.call('EXISTS', ek.kind) == 1 then kinds = hmgetMany(ek.kind, cand) end
  local orders = hmgetMany(ek.order, cand)
  local st, plain, throttled = {}, {}, {}
  local inputs = 0
  for i, step in ipairs(cand) do
    st[#st + 1] = step
    if kinds[i] == 'i' then
      st[#st + 1] = 'input_wait'
      inputs = inputs + 1
      emit(ek, 'type', 'input_requested', 'step', step)
    else
      st[#st + 1] = 'ready'
      local set = plain
      if kinds[i] == 't' then set = throttled end
      set[#set + 1] = orders[i]
      set[#set + 1] = step
    end
  end
  hsetMany(ek.status, st)
  zaddMany(ek.ready, plain)
  zaddMany(ek.readyThrottled, throttled)
  if inputs > 0 then redis.call('HINCRBY', ek.meta, 'waiting_input', inputs) end
  return #cand
end

local function releaseMany(ek, steps)
  if #steps == 0 then return 0 end
  local lists = hmgetMany(ek.children, steps)
  local dec, kids = {}, {}
  local nk = 0
  local function count(child)
    local d = dec[child]
    if d then
      dec[child] = d + 1
    else
      dec[child] = 1
      nk = nk + 1
      kids[nk] = child
    end
  end
  for _, list in ipairs(lists) do
    if list and list ~= '' then
      -- One child (a chain, a fan-in's branches) needs no pattern matching.
      if not string.find(list, ',', 1, true) then
        count(list)
      else
        for child in string.gmatch(list, '[^,]+') do count(child) end
      end
    end
  end
  if #kids == 0 then return 0 end
  local zero = {}
  if #kids <= 2 then
    for _, child in ipairs(kids) do
      if redis.call('HINCRBY', ek.pending, child, -dec[child]) <= 0 then zero[#zero + 1] = child end
    end
  else
    -- Only the counters of dependents still waiting are written back: one that reached
    -- zero is never read again (nothing decrements it twice: each parent completes
    -- once; claims go by status), so a fan-out's release writes no counter at all.
    local left = hmgetMany(ek.pending, kids)
    local flat, nf = {}, 0
    for i, child in ipairs(kids) do
      local v = tonumber(left[i] or '0') - dec[child]
      if v <= 0 then
        zero[#zero + 1] = child
      else
        flat[nf + 1] = child
        flat[nf + 2] = v
        nf = nf + 2
      end
    end
    hsetMany(ek.pending, flat)
  end
  if #zero == 0 then return 0 end
  return enqueueMany(ek, zero)
end
