--- @include "nowMs"
-- Append another component's entry (the runtime's `run_started`, an instance's
-- step-slot evidence) to an execution's ledger: `entry` = {field, value, ...} with
-- `type`. Never creates the stream (NOMKSTREAM: a ledger gone to retention is not
-- recreated without its TTL). When the execution is finalized with archiving on
-- (`archive_hold_s` in meta) and no longer on the archive outbox (archived and
-- settled), it is queued again, due now, so the archiver re-archives it with the new
-- entry. Returns 0 (ledger gone, nothing written), 1 (appended) or 2 (appended and
-- queued for the archiver again).
local function appendEntry(eventsKey, metaKey, outboxKey, executionId, entry)
  local id = redis.call('XADD', eventsKey, 'NOMKSTREAM', '*', unpack(entry))
  if not id then return 0 end
  local meta = redis.call('HMGET', metaKey, 'terminal', 'archive_hold_s')
  if meta[1] and meta[2] and not redis.call('ZSCORE', outboxKey, executionId) then
    redis.call('ZADD', outboxKey, nowMs(), executionId)
    return 2
  end
  return 1
end
