--- @include "nowMs"
-- The publication of publishInstance-2 and publishInstanceQueued-3: the descriptor
-- (its heartbeat_at_ms and capacity.snapshot_at_ms replaced by Redis time, as text:
-- decoding and re-encoding would turn an empty list into an object) set with its TTL,
-- the instance's index entry scored by its expiry, expired entries dropped. Returns
-- the Redis time written.
local function publishDescriptor(descriptorKey, indexKey, instanceId, json, ttlArg)
  local now = nowMs()
  local ttl = tonumber(ttlArg)
  local descriptor = string.gsub(json, '"heartbeat_at_ms":%-?%d+', '"heartbeat_at_ms":' .. now, 1)
  descriptor = string.gsub(descriptor, '"snapshot_at_ms":%-?%d+', '"snapshot_at_ms":' .. now, 1)
  redis.call('SET', descriptorKey, descriptor, 'PX', ttl)
  redis.call('ZADD', indexKey, now + ttl, instanceId)
  redis.call('ZREMRANGEBYSCORE', indexKey, '-inf', now - 1)
  return now
end
