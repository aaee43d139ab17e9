--- @include "bulk"
--- @include "emit"
--- @include "readOutputs"
-- Pop up to `want` steps from the plain ready set and claim them for `owner`:
-- status Running, a fresh claim token, lease expiry in the running set, a
-- `step_claimed` ledger entry each. The whole batch costs a fixed number of hash and
-- sorted-set commands (bulk) plus one XADD per step. Appends
-- [step, token, attempt, nrefs, refs...] per claim to `result` and returns the
-- number claimed.
local function claimReady(ek, owner, want, leaseMs, now, result)
  if want <= 0 then return 0 end
  local popped = redis.call('ZPOPMIN', ek.ready, want)
  if #popped == 0 then return 0 end
  local steps = {}
  for i = 1, #popped, 2 do steps[#steps + 1] = popped[i] end
  local seq = redis.call('HINCRBY', ek.meta, 'claim_seq', #steps)
  local first = seq - #steps
  -- Defensive: a member of the ready set must be Ready with no open dependency.
  local statuses = hmgetMany(ek.status, steps)
  local pending = hmgetMany(ek.pending, steps)
  local ok, numbers = {}, {}
  for i, step in ipairs(steps) do
    if statuses[i] == 'ready' and tonumber(pending[i] or '0') <= 0 then
      ok[#ok + 1] = step
      numbers[#numbers + 1] = first + i
    end
  end
  if #ok == 0 then return 0 end
  local attempts = hmgetMany(ek.attempt, ok)
  local refs = hmgetMany(ek.refs, ok)
  local expiry = now + leaseMs
  local st, tk, ow, tm, rn = {}, {}, {}, {}, {}
  for i, step in ipairs(ok) do
    local token = owner .. '#' .. numbers[i]
    local attempt = attempts[i] or '1'
    st[#st + 1] = step; st[#st + 1] = 'running'
    tk[#tk + 1] = step; tk[#tk + 1] = token
    ow[#ow + 1] = step; ow[#ow + 1] = owner
    tm[#tm + 1] = 'c:' .. step; tm[#tm + 1] = now
    rn[#rn + 1] = expiry; rn[#rn + 1] = step
    emit(ek, 'type', 'step_claimed', 'step', step, 'attempt', attempt, 'worker', owner,
      'token', token)
    result[#result + 1] = step
    result[#result + 1] = token
    result[#result + 1] = attempt
    readOutputsOf(ek, refs[i], result)
  end
  hsetMany(ek.status, st)
  hsetMany(ek.token, tk)
  hsetMany(ek.owner, ow)
  hsetMany(ek.times, tm)
  zaddMany(ek.running, rn)
  redis.call('HINCRBY', ek.meta, 'running', #ok)
  redis.call('HSETNX', ek.meta, 'started_at', now)
  return #ok
end
