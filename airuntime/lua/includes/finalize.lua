--- @include "emit"
--- @include "bulk"
-- Idempotent finalization. Decides whether the execution is terminal and, the
-- first time it is, settles every unfinished step, writes the terminal snapshot,
-- deletes the per-step working keys (the snapshot is the record from then on: a
-- finished execution is its meta, plan, ledger and snapshot, four keys),
-- appends `execution_finalized`, removes the execution from the active index
-- (`ek.activeIndex`, KEYS[22] of every script that includes this one) and then either
-- applies the retention TTL to the four keys left (archiving off: no
-- `archive_hold_s` in meta) or queues the execution on the archive outbox
-- (`ek.archiveOutbox`, KEYS[23]; zset, score = when it is due) and applies the
-- fallback TTL `archive_hold_s` instead: the archiver sets the retention TTL once the
-- execution is durably archived, and a system without an archiver still forgets it.
-- Outbox entries older than the hold name executions whose keys are gone; they are
-- trimmed here, so the outbox stays bounded with no archiver. Cancellation wins:
-- a cancel requested before finalization ends Cancelled even if every step completed.
-- finalizeIfDone returns the terminal status, or false when the execution is not
-- terminal yet.
local function jsonString(s)
  return cjson.encode(s)
end

local function hashToTable(key)
  local flat = redis.call('HGETALL', key)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end

-- The terminal snapshot: one JSON object, its `steps` in the status hash's order,
-- written to `ek.snapshot` by this function. It is written once per execution but
-- costs O(steps) in this call (a 20,000-step fan-out's was ~10 µs of Redis CPU a
-- step), so: no table, concatenation or JSON encoding per step; statuses and worker
-- ids (few distinct values) encoded once; attempts, outputs, finish records and claim
-- times read by HMGET in the status hash's order into arrays, not HGETALL into tables
-- keyed by step id; and the pieces joined and written a chunk at a time (SET, then
-- APPEND), not joined into one string: Lua 5.1's table.concat of a million pieces
-- copies the growing result again and again. (A 100,000-step fan-out's finalizing
-- call: 393-429 -> 334-380 ms for the HMGETs of attempts, outputs and finish
-- records; 380-424 -> 272-293 ms for the chunks and the claim times by HMGET.)
-- A step's `worker` and `finished_at_ms` are those of its finish record
-- (includes/finishRecord: the last attempt that ended, or the owner alone of a claim
-- that expired); `f:<step>` times (written before finish records) are still read,
-- when the times hash holds fields other than the claim times.
-- Every claim has ended when an execution finalizes (no step is Running then), so
-- no worker is looked for in a token.
local function writeSnapshot(ek, final, now)
  -- The meta fields the snapshot copies, read by name: meta also holds the run's
  -- context and inputs JSON (inputs up to the plan's max_input_bytes), which HGETALL
  -- would copy into Lua for nothing.
  local names = {'execution_id', 'pipeline_id', 'tenant_id', 'failure_policy',
    'created_at', 'started_at', 'total', 'completed', 'failed', 'skipped', 'cancelled'}
  local values = redis.call('HMGET', ek.meta, unpack(names))
  local m = {}
  for i, name in ipairs(names) do m[name] = values[i] end
  local statuses = redis.call('HGETALL', ek.status)
  -- Per-step fields read aligned with the status hash's order (HMGET: the lookups run
  -- in the server, and Lua keeps arrays instead of hash tables keyed by step id).
  local ids = {}
  for i = 1, #statuses, 2 do ids[(i + 1) / 2] = statuses[i] end
  local attempts = hmgetMany(ek.attempt, ids)
  local outs = hmgetMany(ek.out, ids)
  local errs = hashToTable(ek.err)
  local owners = hmgetMany(ek.owner, ids)
  local match = string.match
  local claimKeys = {}
  for i, id in ipairs(ids) do claimKeys[i] = 'c:' .. id end
  local claimed = hmgetMany(ek.times, claimKeys)
  local finishedAt = {}
  local found = 0
  for i = 1, #ids do
    if claimed[i] then found = found + 1 end
  end
  if redis.call('HLEN', ek.times) > found then
    -- Retry times (`r:<step>`) or finish times of an older version (`f:<step>`).
    local times = redis.call('HGETALL', ek.times)
    local sub = string.sub
    for i = 1, #times, 2 do
      local k = times[i]
      if sub(k, 1, 2) == 'f:' then finishedAt[sub(k, 3)] = times[i + 1] end
    end
  end
  local encoded = {}
  local function cached(s)
    local e = encoded[s]
    if not e then
      e = jsonString(s)
      encoded[s] = e
    end
    return e
  end
  local out = {
    '{"version":1,"execution_id":', jsonString(m['execution_id'] or ''),
    ',"pipeline_id":', jsonString(m['pipeline_id'] or ''),
    ',"status":', jsonString(final),
    ',"tenant_id":', jsonString(m['tenant_id'] or ''),
    ',"failure_policy":', jsonString(m['failure_policy'] or ''),
    ',"created_at_ms":', m['created_at'] or '0',
    ',"started_at_ms":', m['started_at'] or 'null',
    ',"finished_at_ms":', tostring(now),
    ',"counts":{"total":', m['total'] or '0',
    ',"completed":', m['completed'] or '0',
    ',"failed":', m['failed'] or '0',
    ',"skipped":', m['skipped'] or '0',
    ',"cancelled":', m['cancelled'] or '0',
    '},"steps":{'}
  local n = #out
  local write = 'SET' -- the first chunk replaces, the others append
  -- Step ids match ^[A-Za-z_][A-Za-z0-9_-]*$ (the plan refuses any other), so a JSON
  -- string of one is the id in quotes: no encoding call per step.
  local open = '"'
  for i = 1, #statuses, 2 do
    local step = statuses[i]
    local k = (i + 1) / 2
    out[n + 1] = open
    out[n + 2] = step
    out[n + 3] = '":{"status":'
    out[n + 4] = cached(statuses[i + 1])
    out[n + 5] = ',"attempts":'
    out[n + 6] = attempts[k] or '1'
    n = n + 6
    open = ',"'
    local v = outs[k]
    if v then out[n + 1] = ',"output":'; out[n + 2] = v; n = n + 2 end
    v = errs[step]
    if v then out[n + 1] = ',"error":'; out[n + 2] = jsonString(v); n = n + 2 end
    local worker, finished = nil, finishedAt[step]
    v = owners[k]
    if v then
      local ms, w = match(v, '^(%d+)|(.*)$')
      if ms then worker, finished = w, ms else worker = v end
    end
    if worker then out[n + 1] = ',"worker":'; out[n + 2] = cached(worker); n = n + 2 end
    v = claimed[k]
    if v then out[n + 1] = ',"claimed_at_ms":'; out[n + 2] = v; n = n + 2 end
    if finished then out[n + 1] = ',"finished_at_ms":'; out[n + 2] = finished; n = n + 2 end
    n = n + 1
    out[n] = '}'
    if n >= 20000 then
      redis.call(write, ek.snapshot, table.concat(out, '', 1, n))
      write = 'APPEND'
      out = {}
      n = 0
    end
  end
  out[n + 1] = '}}'
  redis.call(write, ek.snapshot, table.concat(out, '', 1, n + 1))
end

-- The terminal status the counters and control fields call for, or false.
local function terminalStatus(control, failing, running, done, total, failed)
  if control == 'cancel' then
    if running <= 0 then return 'Cancelled' end
  elseif failing == '1' then
    if running <= 0 then return 'Failed' end
  elseif done >= total then
    if failed > 0 then return 'Failed' end
    return 'Succeeded'
  end
  return false
end

-- Every step not finished yet becomes `leftover` (skipped, or cancelled).
local function settleUnfinished(ek, leftover)
  local all = redis.call('HGETALL', ek.status)
  local n = 0
  for i = 1, #all, 2 do
    local st = all[i + 1]
    if st == 'pending' or st == 'ready' or st == 'retry_wait' or st == 'input_wait' or st == 'running' then
      redis.call('HSET', ek.status, all[i], leftover)
      n = n + 1
    end
  end
  redis.call('HINCRBY', ek.meta, leftover, n)
  redis.call('HINCRBY', ek.meta, 'done', n)
end

local function finalizeIfDone(ek, now)
  local m = redis.call('HMGET', ek.meta, 'terminal', 'control', 'failing', 'running', 'done', 'total',
    'failed', 'retention_s', 'execution_id', 'archive_hold_s', 'releasing')
  if m[1] and m[1] ~= '' then return m[1] end
  local done = tonumber(m[5] or '0')
  local total = tonumber(m[6] or '0')
  local final = terminalStatus(m[2], m[3], tonumber(m[4] or '0'), done, total,
    tonumber(m[7] or '0'))
  if not final then return false end
  if done < total then
    local leftover = 'skipped'
    if final == 'Cancelled' then leftover = 'cancelled' end
    settleUnfinished(ek, leftover)
  end
  redis.call('DEL', ek.ready, ek.readyThrottled, ek.delayed, ek.running)
  redis.call('HSET', ek.meta, 'terminal', final, 'status', final, 'finished_at', now, 'running', 0,
    'waiting_input', 0)
  -- A release still going on (a cancel or a failure came first) ends here.
  if m[11] then redis.call('HDEL', ek.meta, 'releasing') end
  writeSnapshot(ek, final, now)
  emit(ek, 'type', 'execution_finalized', 'status', final)
  redis.call('ZREM', ek.activeIndex, m[9])
  local ttl = tonumber(m[8] or '0')
  if m[10] then
    ttl = tonumber(m[10])
    redis.call('ZADD', ek.archiveOutbox, 'NX', now, m[9])
    if ttl > 0 then
      redis.call('ZREMRANGEBYSCORE', ek.archiveOutbox, '-inf', string.format('(%d', now - ttl * 1000))
    end
  end
  -- The snapshot now holds every step's record: the working hashes are dropped (UNLINK:
  -- a large one is freed off the main thread), so a finished execution keeps four keys.
  redis.call('UNLINK', ek.status, ek.pending, ek.children, ek.order, ek.kind, ek.attempt,
    ek.token, ek.owner, ek.out, ek.err, ek.times, ek.refs, ek.maxAttempts)
  if ttl and ttl > 0 then
    for _, key in ipairs({ek.meta, ek.plan, ek.events, ek.snapshot}) do
      redis.call('EXPIRE', key, ttl)
    end
  end
  return final
end
