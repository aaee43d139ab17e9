--[[
  Read what the archiver keeps of a batch of finalized executions of one bucket, in one
  call (one reply instead of four per execution: the archiver's cost per run was
  dominated by the client's work per reply). Read-only.

  The execution keys are built here from each execution's key tag and the suffixes of
  airuntime.core.keys.EXECUTION_KEY_SUFFIXES (meta, plan, snapshot, events); every
  execution of a bucket shares the bucket's hash slot with KEYS[1], so on a Redis
  Cluster the call runs on the shard that holds them all. Each ledger entry's fields
  come as one JSON object (cjson), the text the archive stores as is, with its `type`
  beside it (the archiver need not decode an entry to file it).

  Input:
    KEYS[1] the bucket's archive outbox (air:archive:outbox standalone): routes the call
    ARGV[1] 'all' (meta, plan, snapshot, ledger) or 'events' (the ledger only)
    ARGV[2] F, the number of meta fields to read
    ARGV[3..F+2] the meta fields
    ARGV[F+3..] the key tag of each execution (air:{e:<E>}, air:{x:<b>:<n>}:e:<E>)

  Output: one item per tag, in order,
    'all':    {HMGET of the meta fields, plan or false, snapshot or false, ledger}
    'events': ledger
    where ledger is {{entry id, type, fields as a JSON object}, ...} in stream order
]]

local function ledger(tag)
  local entries = redis.call('XRANGE', tag .. ':events', '-', '+')
  for i = 1, #entries do
    local flat, fields = entries[i][2], {}
    for j = 1, #flat, 2 do fields[flat[j]] = flat[j + 1] end
    entries[i] = {entries[i][1], fields['type'] or '', cjson.encode(fields)}
  end
  return entries
end

local nfields = tonumber(ARGV[2])
local fields = {}
for i = 1, nfields do fields[i] = ARGV[2 + i] end

local out = {}
local everything = ARGV[1] == 'all'
for i = nfields + 3, #ARGV do
  local tag = ARGV[i]
  if everything then
    out[#out + 1] = {
      redis.call('HMGET', tag .. ':meta', unpack(fields)),
      redis.call('GET', tag .. ':plan'),
      redis.call('GET', tag .. ':snapshot'),
      ledger(tag),
    }
  else
    out[#out + 1] = ledger(tag)
  end
end
return out
