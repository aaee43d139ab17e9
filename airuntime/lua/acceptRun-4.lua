--[[
  Accept a run for a runtime instance, idempotent by SharedRunId. In one step it either
  returns the RunId the SharedRunId already has, or creates the mapping, the run record
  and the tenant and state index entries; any number of concurrent deliveries of one
  SharedRunId, to any instances, create one RunId. Every key is in the run's bucket
  (the RunId is drawn in the SharedRunId's bucket), so this is one slot on a cluster.

  On a cluster the instance's local queue is in another slot: the caller pushes the
  RunId there after this script created the run (RunIndex.accept). A caller that dies
  in between leaves a queued run in no queue; its owner's periodic sweep
  (RunIndex.repair_queue) pushes it. The caller checks the queue's room before
  (ARGV[9]). On a standalone server, where the queue shares the run's slot,
  acceptQueuedRun-5 does both at once.

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
--- @include "acceptRunRecord"

return acceptRunRecord(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV, ARGV[9] == '1')
