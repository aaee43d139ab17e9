--[[
  Settle a batch of archived executions of one bucket: the durable write is done, so
  remove each from the archive outbox and give its keys the retention TTL (the meta's
  `retention_s`; 0 = keep: the fallback TTL is removed). One step for the batch: an
  archiver that dies before this call leaves the entries to be leased and archived
  again (idempotently); after it, nothing is archived twice.

  An execution whose ledger grew after the capture (an instance's step-slot evidence
  appended while the archiver wrote) is not settled: its entry is made due now, so the
  next lease archives it again with the new entries (upserts are idempotent).

  The execution keys are built from each execution's key tag and the suffixes given
  (airuntime.core.keys.EXECUTION_RECORD_SUFFIXES: the keys a finalized execution
  keeps); every execution of a bucket shares the bucket's hash slot with KEYS[1].

  Input:
    KEYS[1] the bucket's archive outbox (air:archive:outbox standalone)
    ARGV[1] S, the number of key suffixes
    ARGV[2..S+1] the suffixes (they include 'meta' and 'events')
    ARGV[S+2..] per execution, three values: execution id, key tag, ledger entries the
                archive holds ('' = do not check)

  Output: one item per execution, in order,
    {1, retention_s}   settled (the keys expire in retention_s; 0 = kept)
    {2, entries}       the ledger has more entries than archived: due again now
    {0}                the execution's keys are gone (expired): entry removed only
]]
--- @include "nowMs"

local nsuffix = tonumber(ARGV[1])
local suffixes = {}
for i = 1, nsuffix do suffixes[i] = ARGV[1 + i] end

local function settle(eid, tag, archived)
  local ttl = redis.call('HGET', tag .. ':meta', 'retention_s')
  if not ttl then
    redis.call('ZREM', KEYS[1], eid)
    return {0}
  end
  if archived ~= '' then
    local entries = redis.call('XLEN', tag .. ':events')
    if entries > tonumber(archived) then
      redis.call('ZADD', KEYS[1], nowMs(), eid)
      return {2, entries}
    end
  end
  redis.call('ZREM', KEYS[1], eid)
  ttl = tonumber(ttl)
  for i = 1, nsuffix do
    if ttl > 0 then
      redis.call('EXPIRE', tag .. ':' .. suffixes[i], ttl)
    else
      redis.call('PERSIST', tag .. ':' .. suffixes[i])
    end
  end
  return {1, ttl}
end

local out = {}
for i = nsuffix + 2, #ARGV, 3 do
  out[#out + 1] = settle(ARGV[i], ARGV[i + 1], ARGV[i + 2])
end
return out
