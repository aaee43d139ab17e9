--- @include "bulk"
--- @include "emit"
--- @include "readOutputs"
--- @include "batchEntry"
-- claimListed: claim `ok` (steps known to be Ready, numbered `numbers[i]` in their
-- execution's claim sequence) for `owner`; claimReady: pop up to `want` steps from the
-- plain ready set and claim them so, counting them in meta (or, given `counts`, in
-- counts.claimSeq and counts.running, which the caller writes back). A claim is:
-- status Running, a fresh claim token `<owner>#<claim seq>` (it names the owner: no
-- owner field is written), lease expiry in the running set, and one
-- `steps_claimed` ledger entry for the batch (`worker` the owner; `steps`, `attempts`,
-- `tokens` JSON arrays aligned by index: airuntime.engine.ledger_batches reads it per
-- step). The whole batch costs a fixed number of hash and sorted-set commands (bulk)
-- and one XADD. Appends [step, token, attempt, nrefs, refs...] per claim to `result`
-- and returns the number claimed.
local function claimListed(ek, owner, ok, numbers, leaseMs, now, result)
  local attempts = hmgetMany(ek.attempt, ok)
  local refs = hmgetMany(ek.refs, ok)
  -- Numbers become strings once, not once per step (redis.call formats each number
  -- argument anew).
  local nowS, expiry = tostring(now), tostring(now + leaseMs)
  local st, tk, tm, rn = {}, {}, {}, {}
  local attemptList, tokenList = {}, {}
  local r = #result
  for i, step in ipairs(ok) do
    local token = owner .. '#' .. numbers[i]
    local attempt = attempts[i] or '1'
    local j = 2 * i
    st[j - 1] = step; st[j] = 'running'
    tk[j - 1] = step; tk[j] = token
    tm[j - 1] = 'c:' .. step; tm[j] = nowS
    rn[j - 1] = expiry; rn[j] = step
    attemptList[i] = attempt
    tokenList[i] = token
    result[r + 1] = step
    result[r + 2] = token
    result[r + 3] = attempt
    r = r + 3
    local ref = refs[i]
    if ref then
      readOutputsOf(ek, ref, result)
      r = #result
    else
      r = r + 1
      result[r] = 0
    end
  end
  emitBatch(ek, 'steps_claimed', 'worker', owner, 'steps', ok, 'attempts', attemptList,
    'tokens', tokenList)
  hsetMany(ek.status, st)
  hsetMany(ek.token, tk)
  hsetMany(ek.times, tm)
  zaddMany(ek.running, rn)
  return #ok
end

local function claimReady(ek, owner, want, leaseMs, now, result, counts)
  if want <= 0 then return 0 end
  local popped = redis.call('ZPOPMIN', ek.ready, want)
  if #popped == 0 then return 0 end
  local steps = {}
  for i = 1, #popped, 2 do steps[(i + 1) / 2] = popped[i] end
  local first
  if counts then
    first = counts.claimSeq
    counts.claimSeq = first + #steps
  else
    first = redis.call('HINCRBY', ek.meta, 'claim_seq', #steps) - #steps
  end
  -- Defensive: a member of the ready set must be Ready. (Only a step whose
  -- dependencies all completed is ever made Ready -- released, a root, moved back from
  -- a retry wait or an expired claim -- so its pending counter is not read again: that
  -- read was ~10% of a fan-out step's script time.)
  local statuses = hmgetMany(ek.status, steps)
  local ok, numbers, n = {}, {}, 0
  for i, step in ipairs(steps) do
    if statuses[i] == 'ready' then
      n = n + 1
      ok[n] = step
      numbers[n] = first + i
    end
  end
  if #ok == 0 then return 0 end
  claimListed(ek, owner, ok, numbers, leaseMs, now, result)
  if counts then
    counts.running = counts.running + #ok
  else
    redis.call('HINCRBY', ek.meta, 'running', #ok)
  end
  -- Every claim numbers itself from claim_seq (this one and claimStep's), so only the
  -- execution's first claim finds it at 0 and stamps started_at.
  if first == 0 then redis.call('HSETNX', ek.meta, 'started_at', now) end
  return #ok
end

-- Claim `steps` -- plain steps this call made Ready and held back from the ready set
-- (enqueueMany's hand-off), in plan order -- for `owner` as claimReady would have
-- after putting them there and popping them, without those writes and reads. The
-- claim counters are `counts` (claimSeq, running: numbers the caller read from meta and
-- writes back in its one meta write).
local function claimHeld(ek, owner, steps, leaseMs, now, result, counts)
  local first = counts.claimSeq
  local numbers = {}
  for i = 1, #steps do numbers[i] = first + i end
  counts.claimSeq = first + #steps
  counts.running = counts.running + #steps
  claimListed(ek, owner, steps, numbers, leaseMs, now, result)
  if first == 0 then redis.call('HSETNX', ek.meta, 'started_at', now) end
  return #steps
end
