--[[
  Append another component's entry (the runtime's `run_started`, an instance's
  step-slot evidence) to an execution's ledger. When the execution is finalized with
  archiving on (`archive_hold_s` in its meta) and no longer on the archive outbox (it
  was archived and settled), queue it again, due now: the archiver re-archives it with
  the new entry, so evidence written after the archive is not lost to it.

  Input:
    KEYS[1] the execution's ledger stream (air:{e:<E>}:events)
    KEYS[2] the execution's meta (air:{e:<E>}:meta)
    KEYS[3] air:archive:outbox (of the execution's bucket)
    ARGV[1] execution id
    ARGV[2..] field, value, field, value, ... (the entry; includes `type`)

  Output:
    0   the ledger is gone (retention): nothing written, never recreated
    1   appended
    2   appended, and the execution queued for the archiver again
]]
--- @include "nowMs"

local entry = {}
for i = 2, #ARGV do entry[#entry + 1] = ARGV[i] end
local id = redis.call('XADD', KEYS[1], 'NOMKSTREAM', '*', unpack(entry))
if not id then return 0 end
local meta = redis.call('HMGET', KEYS[2], 'terminal', 'archive_hold_s')
if meta[1] and meta[2] and not redis.call('ZSCORE', KEYS[3], ARGV[1]) then
  redis.call('ZADD', KEYS[3], nowMs(), ARGV[1])
  return 2
end
return 1
