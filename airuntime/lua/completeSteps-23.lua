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
  came one after the other. When nothing else is ready, the steps a completion
  releases are claimed directly (pending -> running, in plan order: what popping the
  ready set would have given) without being written Ready first; the execution's
  meta is read once and written once. A chain's step costs 23 commands (31 before).

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
-- The meta fields this call reads -- the counters it moves, the status inputs, the
-- claim sequence -- in one HMGET, and the ones it changes written back in one HSET
-- (three HINCRBYs, a second HMGET and an HSET before); an execution's meta always holds
-- `done`, so none means no execution.
local m = redis.call('HMGET', ek.meta, 'completed', 'done', 'running', 'terminal',
  'releasing', 'control', 'failing', 'waiting_input', 'status', 'total', 'claim_seq')
if not m[2] then return {-1} end
local steps = {}
for i = 4, #ARGV, 4 do steps[i / 4] = ARGV[i] end
-- Finalized: the step records are in the snapshot and the working hashes are gone;
-- a late completion (a claim recovered from a stalled worker, or the retry of the
-- call that finalized, whose reply was lost) changes nothing and is answered -6.
if m[4] and m[4] ~= '' then
  local late = {m[4], 0, #steps}
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
local counts = {
  completed = tonumber(m[1] or '0'),
  done = tonumber(m[2]),
  running = tonumber(m[3] or '0'),
  claimSeq = tonumber(m[11] or '0'),
}
local readied = 0
-- Plain steps this call makes ready, held back to be claimed below (enqueueMany).
local held = {steps = {}, inputs = 0}
if #accepted > 0 then
  emitBatch(ek, 'steps_completed', 'steps', accepted, 'attempts', attemptList,
    'workers', workerList, 'tokens', tokenList)
  hsetMany(ek.status, st)
  hsetMany(ek.out, out)
  hsetMany(ek.owner, ow)
  zremMany(ek.running, accepted)
  counts.completed = counts.completed + #accepted
  counts.done = counts.done + #accepted
  counts.running = counts.running - #accepted
  readied = releaseMany(ek, accepted, m[5], held)
end
-- Input steps made ready wait for their input (enqueueMany counted them in meta).
local status, mayEnd = statusOf(nil, m[6], m[7], counts.running,
  tonumber(m[8] or '0') + held.inputs, counts.done, tonumber(m[10] or '0'))
-- The meta fields as stored; writeMeta writes the ones that differ from them.
local stored = {completed = m[1], done = m[2], running = m[3], claim_seq = m[11], status = m[9]}
local function writeMeta()
  local current = {completed = counts.completed, done = counts.done,
    running = counts.running, claim_seq = counts.claimSeq, status = status}
  local fields = {}
  for _, name in ipairs({'completed', 'done', 'running', 'claim_seq', 'status'}) do
    local v = current[name]
    if stored[name] ~= tostring(v) then
      fields[#fields + 1] = name
      fields[#fields + 1] = v
      stored[name] = tostring(v)
    end
  end
  if #fields > 0 then redis.call('HSET', ek.meta, unpack(fields)) end
end
local final = false
if mayEnd then
  writeMeta() -- finalizeIfDone reads the counters
  final = finalizeIfDone(ek, now)
end
result[1] = final or status
result[2] = readied
result[3] = #result - 3
local throttledAt = #result + 1
result[throttledAt] = 0
result[throttledAt + 1] = 0
if final then return result end -- finalized: the held steps were settled with the rest
local want = tonumber(ARGV[2])
local made = held.steps
if status ~= 'Running' or want <= 0 then
  readyPlain(ek, made)
else
  if hasKinds(ek, held) then result[throttledAt] = redis.call('ZCARD', ek.readyThrottled) end
  local leaseMs = tonumber(ARGV[3])
  if #made > 0 and #made <= want and redis.call('ZCARD', ek.ready) == 0 then
    -- Nothing else is ready: what this call made ready is what a pop would claim.
    result[throttledAt + 1] = claimHeld(ek, owner, inPlanOrder(ek, made), leaseMs, now, result,
      counts)
  else
    readyPlain(ek, made)
    result[throttledAt + 1] = claimReady(ek, owner, want, leaseMs, now, result, counts)
  end
end
writeMeta()
return result
