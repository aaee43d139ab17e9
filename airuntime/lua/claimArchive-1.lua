--[[
  Lease up to N due entries of the archive outbox to one archiver: every entry whose
  score (when due, ms) is not in the future gets a new score, now + lease. An archiver
  that dies before settling loses nothing: its entries are due again once the lease
  has run out, and the next claim re-reads them (the durable write is idempotent).

  Input:
    KEYS[1] one bucket's archive outbox (air:archive:outbox standalone)
    ARGV[1] most entries to lease (N >= 1)
    ARGV[2] lease, milliseconds

  Output:
    {execution id, ...}   the leased entries (empty: nothing due)
]]
--- @include "nowMs"

local now = nowMs()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local until_ms = now + tonumber(ARGV[2])
for i = 1, #due do
  redis.call('ZADD', KEYS[1], 'XX', until_ms, due[i])
end
return due
