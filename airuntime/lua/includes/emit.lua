-- Append one entry to the execution's ledger stream.
local function emit(...)
  redis.call('XADD', eventsKey, '*', ...)
end
