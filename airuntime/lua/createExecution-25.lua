--[[
  Create an execution: its metadata, the static DAG (children, order, kinds,
  references, retry budgets), every step Pending, and the root steps Ready; list it
  in the execution index and the active index (score = created ms) in the same
  step, so an index entry exists exactly when the execution does.
  Idempotent: creating the same execution id with the same plan digest again
  returns 0 and changes nothing.
  A cancel that came before the execution existed (controlExecution kept its id in
  the early-cancel set) is applied here: the execution is created, cancelled and
  finalized Cancelled in the same step, and nothing is claimed.

  Input:
    KEYS[1..21] the execution's keys (airuntime.keys.EXECUTION_KEY_SUFFIXES)
    KEYS[22] air:executions:active (of the execution's bucket)   KEYS[23] air:archive:outbox (of the execution's bucket) (written only to queue an archived execution again for a new entry)
    KEYS[24] air:executions (of the execution's bucket)
    KEYS[25] air:early-cancels (of the execution's bucket) (zset: id -> ms; the id is removed once applied)
    ARGV[1]  execution id
    ARGV[2]  the plan as stored (Plan.stored: canonical JSON, or zlib of it behind a prefix)
    ARGV[3]  plan digest
    ARGV[4]  pipeline id
    ARGV[5]  failure policy (fail_fast | continue)
    ARGV[6]  retention after finalization, seconds (0 = keep)
    ARGV[7]  tenant id
    ARGV[8]  execution context snapshot JSON
    ARGV[9]  run inputs JSON
    ARGV[10] number of steps N
    ARGV[11] archive hold, seconds: '' or 'off' = archiving off (finalization sets the
             retention TTL); otherwise finalization queues the execution on the
             archive outbox and sets this fallback TTL ('0' = none) -- the archiver
             sets the retention TTL once the execution is durably archived
    ARGV[12] owner (worker id) that claims the first ready steps in the same call
             ('' = claim nothing: the creator is not a worker)
    ARGV[13] maximum number of steps that owner claims
    ARGV[14] lease for those claims, milliseconds
    ARGV[15 + 7*(i-1) .. ] per step: id, order, number of dependencies,
             children (comma-separated), refs (comma-separated), kind ('' | t | i),
             max attempts
    ARGV[15 + 7*N ..] optional: one more ledger entry to append after creating (or
             finding) the execution, field, value, ... with `type` -- the runtime's
             `run_started`, so starting a run costs one round trip (see
             includes/appendEntry: on an existing execution it is appended like
             recordEvent's entries)

  Output:
    {1, status, 0, n, throttledReady, 0, [step, token, attempt, nrefs, (ref, outputJSON) * nrefs] * n}
                 created; n steps claimed for ARGV[12] (claimSteps' reply after the code,
                 so a worker that creates starts without a claim round trip); status
                 'Cancelled' (n = 0) when an early cancel was waiting for it
    {0, status}  already existed with the same plan digest (nothing claimed)
    {-9}         already exists with a different plan
]]
--- @include "execKeys"
--- @include "nowMs"
--- @include "emit"
--- @include "bulk"
--- @include "refreshStatus"
--- @include "appendEntry"
--- @include "claimReady"
--- @include "finalize"

local ek = execKeys(KEYS)
local n = tonumber(ARGV[10])
local entry = {}
for i = 15 + 7 * n, #ARGV do entry[#entry + 1] = ARGV[i] end
if redis.call('EXISTS', ek.meta) == 1 then
  if redis.call('HGET', ek.meta, 'plan_digest') == ARGV[3] then
    if #entry > 0 then appendEntry(ek.events, ek.meta, ek.archiveOutbox, ARGV[1], entry) end
    return {0, redis.call('HGET', ek.meta, 'status')}
  end
  return {-9}
end

local now = nowMs()
-- Every per-step hash is written with a few multi-field commands (includes/bulk), not
-- one command per step and hash: a 100,000-step plan's creation is one script call
-- and holds the server for all of it. A root is written Ready (or WaitingForInput, an
-- `input` root) at once: its order and kind are in the arguments, so it is neither
-- written Pending first nor read back.
local st, ord, pend, ch, rf, kd, ma = {}, {}, {}, {}, {}, {}, {}
local plain, throttled, inputs = {}, {}, {}
for i = 0, n - 1 do
  local base = 15 + 7 * i
  local step, order, kind = ARGV[base], ARGV[base + 1], ARGV[base + 5]
  local status = 'pending'
  local ndeps = tonumber(ARGV[base + 2])
  if ndeps > 0 then
    pend[#pend + 1] = step
    pend[#pend + 1] = ndeps
  elseif kind == 'i' then
    status = 'input_wait'
    inputs[#inputs + 1] = step
  elseif kind == 't' then
    status = 'ready'
    throttled[#throttled + 1] = order
    throttled[#throttled + 1] = step
  else
    status = 'ready'
    plain[#plain + 1] = order
    plain[#plain + 1] = step
  end
  st[#st + 1] = step; st[#st + 1] = status
  ord[#ord + 1] = step; ord[#ord + 1] = order
  if ARGV[base + 3] ~= '' then ch[#ch + 1] = step; ch[#ch + 1] = ARGV[base + 3] end
  if ARGV[base + 4] ~= '' then rf[#rf + 1] = step; rf[#rf + 1] = ARGV[base + 4] end
  if kind ~= '' then kd[#kd + 1] = step; kd[#kd + 1] = kind end
  if tonumber(ARGV[base + 6]) > 1 then ma[#ma + 1] = step; ma[#ma + 1] = ARGV[base + 6] end
end
-- Derived as refreshStatus would from the fields written here (no control, nothing
-- failing or running yet).
local status = 'Running'
if #inputs > 0 then status = 'WaitingForInput' end
local meta = {
  'execution_id', ARGV[1], 'plan_digest', ARGV[3], 'pipeline_id', ARGV[4],
  'failure_policy', ARGV[5], 'retention_s', ARGV[6], 'tenant_id', ARGV[7],
  'context', ARGV[8], 'inputs', ARGV[9], 'total', n, 'done', 0, 'completed', 0,
  'failed', 0, 'skipped', 0, 'cancelled', 0, 'running', 0, 'waiting_input', #inputs,
  'claim_seq', 0, 'created_at', now, 'status', status}
if ARGV[11] ~= '' and ARGV[11] ~= 'off' then
  meta[#meta + 1] = 'archive_hold_s'
  meta[#meta + 1] = ARGV[11]
end
redis.call('HSET', ek.meta, unpack(meta))
redis.call('SET', ek.plan, ARGV[2])
hsetMany(ek.status, st)
hsetMany(ek.order, ord)
hsetMany(ek.pending, pend)
hsetMany(ek.children, ch)
hsetMany(ek.refs, rf)
hsetMany(ek.kind, kd)
hsetMany(ek.maxAttempts, ma)
emit(ek, 'type', 'execution_created', 'pipeline', ARGV[4], 'steps', n, 'tenant', ARGV[7])
redis.call('ZADD', ek.listIndex, 'NX', now, ARGV[1])
redis.call('ZADD', ek.activeIndex, 'NX', now, ARGV[1])
zaddMany(ek.ready, plain)
zaddMany(ek.readyThrottled, throttled)
for _, step in ipairs(inputs) do emit(ek, 'type', 'input_requested', 'step', step) end
if #entry > 0 then emit(ek, unpack(entry)) end
local early = redis.call('ZSCORE', ek.earlyCancels, ARGV[1])
if early then
  redis.call('ZREM', ek.earlyCancels, ARGV[1])
  redis.call('HSET', ek.meta, 'control', 'cancel', 'cancel_requested_at', early)
  emit(ek, 'type', 'cancel_requested', 'actor', 'before creation', 'requested_at', early)
  refreshStatus(ek)
  return {1, finalizeIfDone(ek, now) or refreshStatus(ek), 0, 0, 0, 0}
end
local result = {1, status, 0, 0, #throttled / 2, 0}
if ARGV[12] ~= '' and status == 'Running' then
  result[4] = claimReady(ek, ARGV[12], tonumber(ARGV[13]), tonumber(ARGV[14]), now, result)
end
return result
