--- @include "emit"
-- One ledger entry for a batch of steps (one XADD instead of one per step): `kind` is
-- the entry type (`steps_claimed`, `steps_completed`), then field/value pairs where a
-- table value is a list aligned with the batch's steps, written as a JSON array (step
-- ids, attempts, workers and tokens are strings; a JSON array keeps any character a
-- worker id may hold). airuntime.engine.ledger_batches turns such an entry back into
-- one `step_claimed` / `step_completed` view per step.
local function emitBatch(ek, kind, ...)
  local args = {'type', kind, ...}
  for i = 4, #args, 2 do
    if type(args[i]) == 'table' then args[i] = cjson.encode(args[i]) end
  end
  redis.call('XADD', ek.events, '*', unpack(args))
end
