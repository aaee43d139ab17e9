-- Derive the execution status from its control fields and counters and store it
-- (written only when it changed: most calls of a running execution leave it Running).
-- Only 'Running' allows new claims.
-- Second result, mayEnd: whether the execution can be terminal now (it is already, a
-- cancel or a failure is pending, or every step is done). When false, finalizeIfDone
-- would find nothing to do, so callers write
--   local status, mayEnd = refreshStatus(ek)
--   local final = mayEnd and finalizeIfDone(ek, now)
-- and a call that finishes nothing pays one meta read, not two.

-- The status and mayEnd of these meta values (strings as HMGET gives them, or nil;
-- running, waitingInput, done and total as numbers): the rule both refreshStatus and a
-- script that read the meta fields itself (completeSteps) apply.
local function statusOf(terminal, control, failing, running, waitingInput, done, total)
  local status
  local ended = terminal and terminal ~= ''
  if ended then
    status = terminal
  elseif control == 'cancel' then
    status = 'Cancelling'
  elseif failing == '1' then
    status = 'Failing'
  elseif control == 'pause' then
    if running > 0 then status = 'Pausing' else status = 'Paused' end
  elseif waitingInput > 0 then
    status = 'WaitingForInput'
  else
    status = 'Running'
  end
  local mayEnd = ended or control == 'cancel' or failing == '1' or done >= total
  return status, mayEnd
end

local function refreshStatus(ek)
  local m = redis.call('HMGET', ek.meta, 'terminal', 'control', 'failing', 'running', 'waiting_input',
    'status', 'done', 'total')
  local status, mayEnd = statusOf(m[1], m[2], m[3], tonumber(m[4] or '0'),
    tonumber(m[5] or '0'), tonumber(m[7] or '0'), tonumber(m[8] or '0'))
  if m[6] ~= status then redis.call('HSET', ek.meta, 'status', status) end
  return status, mayEnd
end
