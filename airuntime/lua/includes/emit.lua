-- Append one entry to the execution's ledger stream (`ek`: see execKeys).
local function emit(ek, ...)
  redis.call('XADD', ek.events, '*', ...)
end
