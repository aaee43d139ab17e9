-- Derive the execution status from its control fields and counters and store it
-- (written only when it changed: most calls of a running execution leave it Running).
-- Only 'Running' allows new claims.
-- Second result, mayEnd: whether the execution can be terminal now (it is already, a
-- cancel or a failure is pending, or every step is done). When false, finalizeIfDone
-- would find nothing to do, so callers write
--   local status, mayEnd = refreshStatus(ek)
--   local final = mayEnd and finalizeIfDone(ek, now)
-- and a call that finishes nothing pays one meta read, not two.
local function refreshStatus(ek)
  local m = redis.call('HMGET', ek.meta, 'terminal', 'control', 'failing', 'running', 'waiting_input',
    'status', 'done', 'total')
  local status
  local terminal = m[1] and m[1] ~= ''
  if terminal then
    status = m[1]
  elseif m[2] == 'cancel' then
    status = 'Cancelling'
  elseif m[3] == '1' then
    status = 'Failing'
  elseif m[2] == 'pause' then
    if tonumber(m[4] or '0') > 0 then status = 'Pausing' else status = 'Paused' end
  elseif tonumber(m[5] or '0') > 0 then
    status = 'WaitingForInput'
  else
    status = 'Running'
  end
  if m[6] ~= status then redis.call('HSET', ek.meta, 'status', status) end
  local mayEnd = terminal or m[2] == 'cancel' or m[3] == '1'
    or tonumber(m[7] or '0') >= tonumber(m[8] or '0')
  return status, mayEnd
end
