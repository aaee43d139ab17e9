--- @include "nowMs"
-- The acceptance of acceptRun-4 and acceptQueuedRun-5: the SharedRunId's existing
-- RunId ({0, runId}), {2} when there is no room, or the mapping, the record and the
-- index entries written ({1, runId, now}). mapping, record, byTenant, queued: their
-- KEYS[1..4]; args: their ARGV (1..8 as their headers say); room: whether the local
-- queue has room.
local function acceptRunRecord(mapping, record, byTenant, queued, args, room)
  local existing = redis.call('GET', mapping)
  if existing then return {0, existing} end
  if not room then return {2} end
  local runId = args[1]
  local now = nowMs()
  redis.call('SET', mapping, runId)
  redis.call('HSET', record,
    'run_id', runId,
    'shared_run_id', args[2],
    'instance_id', args[3],
    'tenant_id', args[4],
    'tenant_group_id', args[5],
    'status', 'queued',
    'created_at_ms', now,
    'snapshot', args[6],
    'metadata', args[7],
    'request', args[8])
  redis.call('ZADD', byTenant, now, runId)
  redis.call('ZADD', queued, now, runId)
  return {1, runId, now}
end
