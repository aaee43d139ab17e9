--[[
  Complete a batch of owned steps, then (like BullMQ's moveToFinished) claim up
  to M ready steps for the same worker in the same call, so a worker that keeps
  busy pays less than one round trip per step. Each completion must present the
  claim token of the current claim: a stale worker (its claim expired and was
  recovered, or re-claimed by someone else) is rejected and changes nothing. A
  completed step releases its dependents, at most a budget of them a call (a
  fan-out's root: the rest in the calls that claim next, includes/releaseMany, meta
  `releasing`); the last completion finalizes. The batch is read and written with a
  fixed number of multi-field commands (includes/bulk) plus one ledger entry for the
  accepted completions (`steps_completed`: `steps`, `attempts`, `workers`, `tokens`
  JSON arrays aligned by index, see includes/batchEntry) and one `completion_rejected`
  entry per rejected item; a step named twice in one call is judged as if the calls
  came one after the other.

  Input:
    KEYS[1..21] the execution's keys
    KEYS[22] air:executions:active (of the execution's bucket) (finalizing removes the execution from it)
    KEYS[23] air:archive:outbox (of the execution's bucket) (finalizing queues the execution for the archiver)
    ARGV[1] owner id for the claims made afterwards
    ARGV[2] maximum number of steps to claim afterwards (0 = none)
    ARGV[3] lease for those claims, milliseconds
    ARGV[4 + 4*(i-1) ..] per completion: step id, claim token, worker id, output JSON

  Output:
    {-1}  execution not found
    {status, readied, n, code_1, ..., code_n, throttledReady, claimed,
     [step, token, attempt, nrefs, (ref, outputJSON) * nrefs] * claimed}
      status: execution status (terminal status if this call finalized)
      code_i: 1 accepted, 2 already accepted under this token (a retried call whose
              first reply was lost; nothing changes), -2 step not found, -3 stale
              claim token, -4 step not Running, -6 the execution is already
              finalized (every item; nothing changes, no ledger entry)
]]
--- @include "execKeys"
--- @include "nowMs"
--- @include "bulk"
--- @include "emit"
--- @include "batchEntry"
--- @include "releaseMany"
--- @include "refreshStatus"
--- @include "claimReady"
--- @include "finalize"
--- @include "finishRecord"

local ek = execKeys(KEYS)
-- The counters this call moves, read once and written back in one HSET (three
-- HINCRBYs before); an execution's meta always holds them, so none means no execution.
local counts = redis.call('HMGET', ek.meta, 'completed', 'done', 'running', 'terminal',
  'releasing')
if not counts[2] then return {-1} end
local steps = {}
for i = 4, #ARGV, 4 do steps[i / 4] = ARGV[i] end
-- Finalized: the step records are in the snapshot and the working hashes are gone;
-- a late completion (a claim recovered from a stalled worker, or the retry of the
-- call that finalized, whose reply was lost) changes nothing and is answered -6.
if counts[4] and counts[4] ~= '' then
  local late = {counts[4], 0, #steps}
  for k = 1, #steps do late[3 + k] = -6 end
  late[#late + 1] = 0
  late[#late + 1] = 0
  return late
end
local owner = ARGV[1]
local now = nowMs()
local result = {'', 0, 0}
local statuses = hmgetMany(ek.status, steps)
local tokens = hmgetMany(ek.token, steps)
local attempts = hmgetMany(ek.attempt, steps)
local done = {}
local accepted, n = {}, 0
local st, out, ow = {}, {}, {}
local attemptList, workerList, tokenList = {}, {}, {}
-- now as a string once (redis.call formats a number argument anew each time)
local nowS = tostring(now)
local r = 3
for k, step in ipairs(steps) do
  local i = 4 * k
  local token, worker, output = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local s = statuses[k]
  if done[step] then s = 'completed' end
  local code
  if not s then
    code = -2
  elseif tokens[k] ~= token then
    code = -3
  elseif s == 'completed' then
    code = 2
  elseif s ~= 'running' then
    code = -4
  else
    code = 1
    done[step] = true
    n = n + 1
    accepted[n] = step
    local j = 2 * n
    st[j - 1] = step; st[j] = 'completed'
    out[j - 1] = step; out[j] = output
    ow[j - 1] = step; ow[j] = finishRecord(nowS, worker)
    attemptList[n] = attempts[k] or '1'
    workerList[n] = worker
    tokenList[n] = token
  end
  if code < 0 then
    emit(ek, 'type', 'completion_rejected', 'step', step, 'worker', worker, 'token', token, 'code', code)
  end
  r = r + 1
  result[r] = code
end
local readied = 0
if #accepted > 0 then
  emitBatch(ek, 'steps_completed', 'steps', accepted, 'attempts', attemptList,
    'workers', workerList, 'tokens', tokenList)
  hsetMany(ek.status, st)
  hsetMany(ek.out, out)
  hsetMany(ek.owner, ow)
  zremMany(ek.running, accepted)
  redis.call('HSET', ek.meta, 'completed', tonumber(counts[1] or '0') + #accepted,
    'done', tonumber(counts[2]) + #accepted, 'running', tonumber(counts[3] or '0') - #accepted)
  readied = releaseMany(ek, accepted, counts[5])
end
local status, mayEnd = refreshStatus(ek)
local final = mayEnd and finalizeIfDone(ek, now)
result[1] = final or status
result[2] = readied
result[3] = #result - 3
local throttledAt = #result + 1
result[throttledAt] = 0
result[throttledAt + 1] = 0
if not final and status == 'Running' then
  result[throttledAt] = redis.call('ZCARD', ek.readyThrottled)
  result[throttledAt + 1] = claimReady(ek, owner, tonumber(ARGV[2]), tonumber(ARGV[3]), now, result)
end
return result
