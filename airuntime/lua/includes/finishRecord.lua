-- The finish record of a step: `<finished ms>|<worker id>` in the `owner` hash, written
-- when an attempt ends (completed, failed, stopped; an input step's value provided).
-- One field instead of two (the worker in `owner`, `f:<step>` in `times`): on a
-- fan-out step's completion that second hash write was ~12% of the script's time. A
-- claim writes no record (its token `<owner>#<seq>` names the owner); a claim whose
-- lease ran out leaves its owner alone, with no time (includes/moveDue). The terminal
-- snapshot (includes/finalize) reads both forms; a plain worker id written before this
-- format reads the same way.
local function finishRecord(ms, worker)
  return ms .. '|' .. worker
end
