-- Make a shared-queue item Pending at the tail of the queue (FIFO by enqueue time):
-- its hash (status, tenant, enqueue time and score) and its pending-zset entry.
local function putPending(pendingKey, itemKey, srid, tenantId, now, nowUs)
  redis.call('HSET', itemKey, 'status', 'Pending', 'shared_run_id', srid, 'tenant_id', tenantId,
    'enqueued_at_ms', now, 'score', nowUs)
  redis.call('HDEL', itemKey, 'claim_token', 'claimed_by')
  redis.call('HINCRBY', itemKey, 'enqueues', 1)
  redis.call('ZADD', pendingKey, nowUs, srid)
end
