--[[
  Settle one archived execution: the durable write is done, so remove the execution
  from the archive outbox and give its keys the retention TTL (the meta's
  `retention_s`; 0 = keep: the fallback TTL is removed). One step: an archiver that
  dies before this call leaves the entry to be leased and archived again
  (idempotently); after it, nothing is archived twice.

  A ledger that grew after the capture (an instance's step-slot evidence appended
  while the archiver wrote) is not settled: the entry is made due now, so the next
  lease archives the execution again with the new entries (upserts are idempotent).

  Input:
    KEYS[1..21] the execution's keys (airuntime.keys.EXECUTION_KEY_SUFFIXES; KEYS[20]
                is the ledger stream)
    KEYS[22] air:archive:outbox (of the execution's bucket)
    ARGV[1] execution id
    ARGV[2] ledger entries the archive holds ('' = do not check)

  Output:
    {1, retention_s}   settled (the keys expire in retention_s; 0 = kept)
    {2, entries}       the ledger has more entries than archived: due again now
    {0}                the execution's keys are gone (expired): entry removed only
]]
--- @include "nowMs"

local ttl = redis.call('HGET', KEYS[1], 'retention_s')
if not ttl then
  redis.call('ZREM', KEYS[22], ARGV[1])
  return {0}
end
if ARGV[2] ~= '' then
  local entries = redis.call('XLEN', KEYS[20])
  if entries > tonumber(ARGV[2]) then
    redis.call('ZADD', KEYS[22], nowMs(), ARGV[1])
    return {2, entries}
  end
end
redis.call('ZREM', KEYS[22], ARGV[1])
ttl = tonumber(ttl)
for i = 1, 21 do
  if ttl > 0 then
    redis.call('EXPIRE', KEYS[i], ttl)
  else
    redis.call('PERSIST', KEYS[i])
  end
end
return {1, ttl}
