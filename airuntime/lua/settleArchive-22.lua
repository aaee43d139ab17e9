--[[
  Settle one archived execution: the durable write is done, so remove the execution
  from the archive outbox and give its keys the retention TTL (the meta's
  `retention_s`; 0 = keep: the fallback TTL is removed). One step: an archiver that
  dies before this call leaves the entry to be leased and archived again
  (idempotently); after it, nothing is archived twice.

  Input:
    KEYS[1..21] the execution's keys (airuntime.keys.EXECUTION_KEY_SUFFIXES)
    KEYS[22] air:archive:outbox
    ARGV[1] execution id

  Output:
    {1, retention_s}   settled (the keys expire in retention_s; 0 = kept)
    {0}                the execution's keys are gone (expired): entry removed only
]]
redis.call('ZREM', KEYS[22], ARGV[1])
local ttl = redis.call('HGET', KEYS[1], 'retention_s')
if not ttl then return {0} end
ttl = tonumber(ttl)
for i = 1, 21 do
  if ttl > 0 then
    redis.call('EXPIRE', KEYS[i], ttl)
  else
    redis.call('PERSIST', KEYS[i])
  end
end
return {1, ttl}
