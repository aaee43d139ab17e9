-- Idempotent finalization. Decides whether the execution is terminal and, the
-- first time it is, settles every unfinished step, writes the terminal snapshot,
-- appends `execution_finalized` and applies the retention TTL. Cancellation wins:
-- a cancel requested before finalization ends Cancelled even if every step completed.
-- Returns the terminal status, or false when the execution is not terminal yet.
local function jsonString(s)
  return cjson.encode(s)
end

local function buildSnapshot(final, now)
  local meta = redis.call('HGETALL', metaKey)
  local m = {}
  for i = 1, #meta, 2 do m[meta[i]] = meta[i + 1] end
  local function hashToTable(key)
    local flat = redis.call('HGETALL', key)
    local t = {}
    for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
    return t
  end
  local statuses = redis.call('HGETALL', statusKey)
  local attempts = hashToTable(attemptKey)
  local outs = hashToTable(outKey)
  local errs = hashToTable(errKey)
  local owners = hashToTable(ownerKey)
  local times = hashToTable(timesKey)
  local parts = {}
  for i = 1, #statuses, 2 do
    local step = statuses[i]
    local p = {jsonString(step), ':{"status":', jsonString(statuses[i + 1]),
      ',"attempts":', attempts[step] or '1'}
    if outs[step] then p[#p + 1] = ',"output":' .. outs[step] end
    if errs[step] then p[#p + 1] = ',"error":' .. jsonString(errs[step]) end
    if owners[step] then p[#p + 1] = ',"worker":' .. jsonString(owners[step]) end
    if times['c:' .. step] then p[#p + 1] = ',"claimed_at_ms":' .. times['c:' .. step] end
    if times['f:' .. step] then p[#p + 1] = ',"finished_at_ms":' .. times['f:' .. step] end
    p[#p + 1] = '}'
    parts[#parts + 1] = table.concat(p)
  end
  return table.concat({
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
    '},"steps":{', table.concat(parts, ','), '}}'})
end

local function finalizeIfDone(now)
  local m = redis.call('HMGET', metaKey, 'terminal', 'control', 'failing', 'running', 'done', 'total',
    'failed', 'retention_s')
  if m[1] and m[1] ~= '' then return m[1] end
  local running = tonumber(m[4] or '0')
  local done = tonumber(m[5] or '0')
  local total = tonumber(m[6] or '0')
  local failed = tonumber(m[7] or '0')
  local final = false
  if m[2] == 'cancel' then
    if running <= 0 then final = 'Cancelled' end
  elseif m[3] == '1' then
    if running <= 0 then final = 'Failed' end
  elseif done >= total then
    if failed > 0 then final = 'Failed' else final = 'Succeeded' end
  end
  if not final then return false end
  if done < total then
    local leftover = 'skipped'
    if final == 'Cancelled' then leftover = 'cancelled' end
    local all = redis.call('HGETALL', statusKey)
    local n = 0
    for i = 1, #all, 2 do
      local st = all[i + 1]
      if st == 'pending' or st == 'ready' or st == 'retry_wait' or st == 'input_wait' or st == 'running' then
        redis.call('HSET', statusKey, all[i], leftover)
        n = n + 1
      end
    end
    redis.call('HINCRBY', metaKey, leftover, n)
    redis.call('HINCRBY', metaKey, 'done', n)
  end
  redis.call('DEL', readyKey, readyThrottledKey, delayedKey, runningKey)
  redis.call('HSET', metaKey, 'terminal', final, 'status', final, 'finished_at', now, 'running', 0,
    'waiting_input', 0)
  redis.call('SET', snapshotKey, buildSnapshot(final, now))
  emit('type', 'execution_finalized', 'status', final)
  local ttl = tonumber(m[8] or '0')
  if ttl and ttl > 0 then
    for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
  end
  return final
end
