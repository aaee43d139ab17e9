-- The keys of one execution as one table, built once per script call
-- (`local ek = execKeys(KEYS)`; order: airuntime.core.keys.EXECUTION_KEY_SUFFIXES).
-- Every include that reads or writes execution state takes this table as its first
-- argument. Scripts that can finalize get KEYS[22] `activeIndex`
-- (air:executions:active) and KEYS[23] `archiveOutbox` (air:archive:outbox);
-- createExecution also KEYS[24] `listIndex` (air:executions); createExecution and
-- controlExecution also KEYS[25] `earlyCancels` (air:early-cancels: cancels of an
-- execution not created yet); all are nil for the 21-key scripts.
local function execKeys(keys)
  return {
    meta = keys[1],
    plan = keys[2],
    status = keys[3],
    pending = keys[4],
    children = keys[5],
    order = keys[6],
    kind = keys[7],
    ready = keys[8],
    readyThrottled = keys[9],
    delayed = keys[10],
    running = keys[11],
    attempt = keys[12],
    token = keys[13],
    owner = keys[14],
    out = keys[15],
    err = keys[16],
    times = keys[17],
    refs = keys[18],
    maxAttempts = keys[19],
    events = keys[20],
    snapshot = keys[21],
    activeIndex = keys[22],
    archiveOutbox = keys[23],
    listIndex = keys[24],
    earlyCancels = keys[25],
  }
end
