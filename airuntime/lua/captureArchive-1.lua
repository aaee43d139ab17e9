--[[
  Read what the archiver keeps of a batch of finalized executions of one bucket, in one
  call (one reply instead of four per execution: the archiver's cost per run was
  dominated by the client's work per reply). Read-only.

  The execution keys are built here from each execution's key tag and the suffixes of
  airuntime.core.keys.EXECUTION_KEY_SUFFIXES (meta, plan, snapshot, events); every
  execution of a bucket shares the bucket's hash slot with KEYS[1], so on a Redis
  Cluster the call runs on the shard that holds them all. Each ledger entry's fields
  come as one JSON object (cjson), the text the archive stores as is.

  Input:
    KEYS[1] the bucket's archive outbox (air:archive:outbox standalone): routes the call
    ARGV[1] 'all' (meta, plan, snapshot, ledger) or 'events' (the ledger only)
    ARGV[2..] the key tag of each execution (air:{e:<E>}, air:{x:<b>:<n>}:e:<E>)

  Output: one item per tag, in order,
    'all':    {meta as HGETALL's flat list, plan or false, snapshot or false, ledger}
    'events': ledger
    where ledger is {{entry id, fields as a JSON object}, ...} in stream order
]]

local function ledger(tag)
  local entries = redis.call('XRANGE', tag .. ':events', '-', '+')
  for i = 1, #entries do
    local flat, fields = entries[i][2], {}
    for j = 1, #flat, 2 do fields[flat[j]] = flat[j + 1] end
    entries[i][2] = cjson.encode(fields)
  end
  return entries
end

local out = {}
local everything = ARGV[1] == 'all'
for i = 2, #ARGV do
  local tag = ARGV[i]
  if everything then
    out[i - 1] = {
      redis.call('HGETALL', tag .. ':meta'),
      redis.call('GET', tag .. ':plan'),
      redis.call('GET', tag .. ':snapshot'),
      ledger(tag),
    }
  else
    out[i - 1] = ledger(tag)
  end
end
return out
