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
--- @include "appendEntry"

local entry = {}
for i = 2, #ARGV do entry[#entry + 1] = ARGV[i] end
return appendEntry(KEYS[1], KEYS[2], KEYS[3], ARGV[1], entry)
