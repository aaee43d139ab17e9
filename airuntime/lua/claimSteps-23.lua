--[[
  Claim up to N ready (unthrottled) steps for one owner, in topological order.

  Before claiming: retry-due steps become ready, Running steps whose lease
  expired return to Ready with their attempt count unchanged (recovery is not a
  retry), and a release of dependents an earlier completion left unfinished (meta
  `releasing`, includes/releaseMany) goes on by up to its budget. Claims happen
  only while the execution status is Running (Pausing, Paused, WaitingForInput,
  Cancelling, Failing and terminal states block them); a blocked call still
  recovers and may finalize. Each claimed step gets a fresh claim token, its lease
  expiry in the running set and a `step_claimed` entry.

  Input:
    KEYS[1..21] the execution's keys
    KEYS[22] air:executions:active (of the execution's bucket) (finalizing removes the execution from it)
    KEYS[23] air:archive:outbox (of the execution's bucket) (finalizing queues the execution for the archiver)
    ARGV[1] owner (worker id)
    ARGV[2] maximum number of steps to claim
    ARGV[3] lease, milliseconds
    ARGV[4] maximum number of due retries / expired leases to move in this call

  Output:
    {-1}                                   execution not found
    {status, wakeMs, n, throttledReady, recovered,
     [step, token, attempt, nrefs, (ref, outputJSON) * nrefs] * n}
      status: execution status after the call; wakeMs: ms until the next retry
      or lease expiry (-1 none) so idle workers sleep exactly as long as needed;
      throttledReady: ready steps that need a concurrency lease (claimStep path);
      recovered: expired Running steps this call returned to Ready.
]]
--- @include "execKeys"
--- @include "nowMs"
--- @include "moveDue"
--- @include "nextWake"
--- @include "refreshStatus"
--- @include "releaseMany"
--- @include "claimReady"
--- @include "finalize"

local ek = execKeys(KEYS)
if redis.call('EXISTS', ek.meta) == 0 then return {-1} end
local owner = ARGV[1]
local want = tonumber(ARGV[2])
local leaseMs = tonumber(ARGV[3])
local now = nowMs()

local m = redis.call('HMGET', ek.meta, 'terminal', 'releasing')
local terminal = m[1]
if terminal and terminal ~= '' then return {terminal, -1, 0, 0, 0} end

local _, recovered = moveDue(ek, now, tonumber(ARGV[4]))
local status, mayEnd = refreshStatus(ek)
if status ~= 'Running' then
  local final = mayEnd and finalizeIfDone(ek, now)
  if final then return {final, -1, 0, 0, recovered} end
  return {status, nextWake(ek, now), 0, 0, recovered}
end

-- A long release an earlier completion left goes on before claiming (includes/releaseMany).
if m[2] then releaseMany(ek, {}, m[2]) end
local result = {status, 0, 0, redis.call('ZCARD', ek.readyThrottled), recovered}
local claimed = claimReady(ek, owner, want, leaseMs, now, result)
result[3] = claimed
if claimed == 0 then result[2] = nextWake(ek, now) end
return result
