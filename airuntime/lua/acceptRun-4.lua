--[[
  Accept a run for a runtime instance, idempotent by SharedRunId. In one step it either
  returns the RunId the SharedRunId already has, or creates the mapping, the run record
  and the tenant and state index entries; any number of concurrent deliveries of one
  SharedRunId, to any instances, create one RunId. Every key is in the run's bucket
  (the RunId is drawn in the SharedRunId's bucket), so this is one slot on a cluster.

  The instance's local queue is in another slot: the caller pushes the RunId there
  after this script created the run (RunIndex.accept). A caller that dies in between
  leaves a queued run in no queue; its owner's periodic sweep (RunIndex.repair_queue)
  pushes it. The caller checks the queue's room before (ARGV[9]).

  Input:
    KEYS[1] SharedRunId -> RunId mapping (<bucket>:shared-run:<SharedRunId>)
    KEYS[2] record of the run to create (<bucket>:run:<ARGV[1]>)
    KEYS[3] the bucket's index of the tenant's runs (<bucket>:runs:tenant:<ARGV[4]>)
    KEYS[4] the bucket's queued runs (<bucket>:runs:queued)
    (<bucket> = air:{air} on a standalone server, air:{rb:<b>:<n>} on a cluster)
    ARGV[1] RunId to create (unused when the SharedRunId already has one)
    ARGV[2] SharedRunId
    ARGV[3] accepting instance id
    ARGV[4] tenant id (the request snapshot's)
    ARGV[5] tenant group id ('' = none)
    ARGV[6] snapshot JSON
    ARGV[7] metadata JSON
    ARGV[8] request JSON (pipeline + inputs, so another instance can adopt the run)
    ARGV[9] '1' when the local queue has room, '0' when it is full

  Output:
    {1, runId, createdAtMs}  created
    {0, runId}               the SharedRunId already has this run; nothing written
    {2}                      the local queue is full; nothing written
]]
--- @include "nowMs"

local existing = redis.call('GET', KEYS[1])
if existing then return {0, existing} end
if ARGV[9] ~= '1' then return {2} end

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
return {1, runId, now}
