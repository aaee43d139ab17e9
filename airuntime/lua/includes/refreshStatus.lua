-- Derive the execution status from its control fields and counters and store it
-- (written only when it changed: most calls of a running execution leave it Running).
-- Only 'Running' allows new claims.
local function refreshStatus(ek)
  local m = redis.call('HMGET', ek.meta, 'terminal', 'control', 'failing', 'running', 'waiting_input',
    'status')
  local status
  if m[1] and m[1] ~= '' then
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
  return status
end
