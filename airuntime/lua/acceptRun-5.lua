--[[
  Accept a run into a runtime instance's local queue, idempotent by SharedRunId. In one
  step it either returns the RunId the SharedRunId already has, or creates the mapping,
  the run record, the tenant and state index entries and the queue entry. Nothing is
  ever half-written, so no delivery has anything to repair; any number of concurrent
  deliveries of one SharedRunId, to any instances, create one RunId and one queue entry.

  Input:
    KEYS[1] SharedRunId -> RunId mapping (air:{air}:shared-run:<SharedRunId>)
    KEYS[2] record of the run to create (air:{air}:run:<ARGV[1]>)
    KEYS[3] the tenant's run index (air:{air}:runs:tenant:<ARGV[4]>)
    KEYS[4] queued runs (air:{air}:runs:queued)
    KEYS[5] the accepting instance's local queue (air:{air}:instance:<ARGV[3]>:queue)
    ARGV[1] RunId to create (unused when the SharedRunId already has one)
    ARGV[2] SharedRunId
    ARGV[3] accepting instance id
    ARGV[4] tenant id (the request snapshot's)
    ARGV[5] tenant group id ('' = none)
    ARGV[6] snapshot JSON
    ARGV[7] metadata JSON
    ARGV[8] request JSON (pipeline + inputs, so another instance can adopt the run)
    ARGV[9] queue capacity: runs the local queue may hold

  Output:
    {1, runId, createdAtMs}  created
    {0, runId}               the SharedRunId already has this run; nothing written
    {2, queued}              the local queue is full; nothing written
]]
--- @include "nowMs"

local existing = redis.call('GET', KEYS[1])
if existing then return {0, existing} end
local queued = redis.call('LLEN', KEYS[5])
if queued >= tonumber(ARGV[9]) then return {2, queued} end

local runId = ARGV[1]
local now = nowMs()
redis.call('SET', KEYS[1], runId)
redis.call('HSET', KEYS[2],
  'run_id', runId,
  'shared_run_id', ARGV[2],
  'instance_id', ARGV[3],
  'tenant_id', ARGV[4],
  'tenant_group_id', ARGV[5],
  'status', 'queued',
  'created_at_ms', now,
  'snapshot', ARGV[6],
  'metadata', ARGV[7],
  'request', ARGV[8])
redis.call('ZADD', KEYS[3], now, runId)
redis.call('ZADD', KEYS[4], now, runId)
redis.call('RPUSH', KEYS[5], runId)
return {1, runId, now}
