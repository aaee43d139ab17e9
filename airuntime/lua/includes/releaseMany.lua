--- @include "bulk"
--- @include "emit"
-- Steps completed: decrement each dependent's counter once per completed parent and
-- make the dependents that reach zero (and are still pending) ready -- the plain or
-- throttled ready set (score = topological order), or WaitingForInput for an `input`
-- step -- in a fixed number of commands (bulk) per call and at most releaseBudget()
-- dependents a call; a longer release goes on in the calls that claim next.
-- enqueueMany: make `steps` (counters at zero) ready; returns the number made ready
-- (input steps included). With `held` (completeSteps, which claims next in the same
-- call: a table {steps = {...}, inputs = 0}) and a plan of plain steps only, the steps
-- are appended to held.steps instead and nothing is written: the caller either claims
-- them at once (claimHeld) or writes them Ready after all (readyPlain) -- a chain's
-- next step goes from pending to running without passing through the ready set.
-- held.inputs counts the input steps made ready (WaitingForInput; added to the meta
-- field `waiting_input` here), so the caller need not read that field again.

-- Whether the execution's plan has throttled or input steps (the kind hash holds them;
-- most plans have none, and then there is no throttled ready set either). With a
-- `memo` table, read once a call.
local function hasKinds(ek, memo)
  if memo and memo.kinds ~= nil then return memo.kinds end
  local kinds = redis.call('EXISTS', ek.kind) == 1
  if memo then memo.kinds = kinds end
  return kinds
end

-- Make plain steps Ready: status, and the plain ready set scored by plan order. For
-- enqueueMany, and for completeSteps' held steps that it does not claim after all.
local function readyPlain(ek, steps)
  if #steps == 0 then return end
  local orders = hmgetMany(ek.order, steps)
  local st, ready = {}, {}
  for i, step in ipairs(steps) do
    local j = 2 * i
    st[j - 1] = step; st[j] = 'ready'
    ready[j - 1] = orders[i]; ready[j] = step
  end
  hsetMany(ek.status, st)
  zaddMany(ek.ready, ready)
end

local function enqueueMany(ek, steps, held)
  local statuses = hmgetMany(ek.status, steps)
  local cand = {}
  for i, step in ipairs(steps) do
    if statuses[i] == 'pending' then cand[#cand + 1] = step end
  end
  if #cand == 0 then return 0 end
  if not hasKinds(ek, held) then
    if held then
      local list = held.steps
      for _, step in ipairs(cand) do list[#list + 1] = step end
    else
      readyPlain(ek, cand)
    end
    return #cand
  end
  local kinds = hmgetMany(ek.kind, cand)
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
  if inputs > 0 then
    redis.call('HINCRBY', ek.meta, 'waiting_input', inputs)
    if held then held.inputs = held.inputs + inputs end
  end
  return #cand
end

-- The most dependents one call releases. A completion whose dependents are more (a
-- fan-out's root) releases this many and leaves the rest to the calls that claim next
-- (releaseMany, meta `releasing`): a script holds its server, and releasing 100,000
-- children at once held it ~245 ms, every other execution and tenant on that shard
-- waiting.
local function releaseBudget() return 4096 end

-- Decrement the counters of the dependents listed in `lists` (comma-separated step
-- ids), list i from byte `starts[i]`, at most `budget` dependents in all, and make
-- those that reach zero ready. Returns the number made ready, the lists not
-- finished ({parent, next byte, parent, next byte, ...}) and the number of dependents
-- taken (a dependent named by two lists is decremented once for each; nothing is
-- decremented twice for one list).
local function releaseLists(ek, parents, lists, starts, budget, held)
  local dec, kids = {}, {}
  local nk, taken = 0, 0
  local rest = {}
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
  local find, sub = string.find, string.sub
  for i, list in ipairs(lists) do
    if list and list ~= '' then
      local pos = starts[i]
      if pos == 1 and not find(list, ',', 1, true) then
        -- One child (a chain, a fan-in's branches) needs no scanning.
        if taken < budget then
          count(list)
          taken = taken + 1
        else
          rest[#rest + 1] = parents[i]
          rest[#rest + 1] = 1
        end
      else
        local len = #list
        while pos <= len do
          if taken >= budget then
            rest[#rest + 1] = parents[i]
            rest[#rest + 1] = pos
            break
          end
          local comma = find(list, ',', pos, true)
          local stop = (comma or (len + 1)) - 1
          if stop >= pos then
            count(sub(list, pos, stop))
            taken = taken + 1
          end
          pos = stop + 2
        end
      end
    end
  end
  if nk == 0 then return 0, rest, taken end
  local zero = {}
  if nk <= 2 then
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
  if #zero == 0 then return 0, rest, taken end
  return enqueueMany(ek, zero, held), rest, taken
end

-- The meta field `releasing` after a call: the lists still `open` ("parent=next
-- byte,..."; '' none) and the ones this call left (`rest`); written only when changed.
local function keepReleasing(ek, before, open, rest)
  local parts = {}
  if open ~= '' then parts[1] = open end
  for i = 1, #rest, 2 do parts[#parts + 1] = rest[i] .. '=' .. rest[i + 1] end
  local now = table.concat(parts, ',')
  if now ~= before then
    if now == '' then
      redis.call('HDEL', ek.meta, 'releasing')
    else
      redis.call('HSET', ek.meta, 'releasing', now)
    end
  end
  return now
end

-- Release the dependents of the completed `steps` (at most releaseBudget() of them),
-- then, with budget left, go on with the releases earlier calls left (`open`: meta
-- field `releasing` as the caller read it, nil or '' when none). Returns the number of
-- steps made ready (input steps included) and `releasing` as it is now. `held`: see
-- enqueueMany.
local function releaseMany(ek, steps, open, held)
  open = open or ''
  local before = open
  local budget = releaseBudget()
  local readied = 0
  if #steps > 0 then
    local lists = hmgetMany(ek.children, steps)
    local starts = {}
    for i = 1, #steps do starts[i] = 1 end
    local rest, taken
    readied, rest, taken = releaseLists(ek, steps, lists, starts, budget, held)
    budget = budget - taken
    if #rest > 0 then
      -- This call's lists go after the ones already open, which are continued first.
      open = keepReleasing(ek, before, open, rest)
      before = open
    end
  end
  if open ~= '' and budget > 0 then
    local parents, starts = {}, {}
    for parent, pos in string.gmatch(open, '([^,=]+)=(%d+)') do
      parents[#parents + 1] = parent
      starts[#starts + 1] = tonumber(pos)
    end
    local more, rest = releaseLists(ek, parents, hmgetMany(ek.children, parents), starts, budget,
      held)
    readied = readied + more
    open = keepReleasing(ek, before, '', rest)
  end
  return readied, open
end

-- `steps` in plan order (the order the ready set pops them in: scored by plan
-- position, which is unique).
local function inPlanOrder(ek, steps)
  if #steps < 2 then return steps end
  local orders = hmgetMany(ek.order, steps)
  local pos = {}
  for i, step in ipairs(steps) do pos[step] = tonumber(orders[i]) end
  local sorted = {}
  for i, step in ipairs(steps) do sorted[i] = step end
  table.sort(sorted, function(a, b) return pos[a] < pos[b] end)
  return sorted
end
