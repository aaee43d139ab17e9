--[[
  Submit a shared run (QueueFirst): its record, already QueuedGlobally, and its index
  entries (all runs, its tenant's runs, open runs) in one step, all in the control
  slot ({air}). Its Pending item goes into the tenant's queue ({q:<tenant>}, another
  slot) right after, by enqueueSharedRun-2.lua: a cancel landing in between finds no
  item and cancels the record, and the pump settles the item it later claims as
  Cancelled (the record is no longer QueuedGlobally); a submitter that dies in
  between leaves a QueuedGlobally record without an item, which the reconciler
  requeues once it has been quiet (stale_after_ms).
  The submitter compiled the pipeline against its tenant's settings as it last read
  them (a control plane keeps them between submits instead of reading them for each,
  airuntime.control_plane.tenant_settings_cache); they are checked here, in the step
  that creates the record: settings changed since then write nothing (-2), and the
  submitter reads them again, compiles again and removes the item it queued beside
  this call.

  Input:
    KEYS[1] the run's record (air:{air}:srun:<SharedRunId>)
    KEYS[2] all shared runs zset (air:{air}:sruns)
    KEYS[3] the tenant's shared runs zset (air:{air}:sruns:tenant:<tenant>)
    KEYS[4] open shared runs zset (air:{air}:sruns:open)
    KEYS[5] tenant of each open shared run (air:{air}:sruns:open:tenant, hash)
    KEYS[6] the tenant's settings (air:{air}:tenant:<tenant>:settings, string)
    KEYS[7] the submission's idempotency key (air:{air}:idem:<tenant>:<sha-256 of the
            key>, string "<SharedRunId> <request fingerprint>"); without ARGV[6] any
            key of the slot (the caller passes KEYS[2]), never touched
    ARGV[1] SharedRunId
    ARGV[2] the record (JSON, status QueuedGlobally)
    ARGV[3] created_at_ms (the record's; the index score)
    ARGV[4] tenant id
    ARGV[5] the tenant's settings as the submitter compiled against them, byte for
            byte ('' = none were stored: the Shared defaults)
    ARGV[6] '' (no idempotency key), or what KEYS[7] is set to: "<SharedRunId>
            <request fingerprint>"
    ARGV[7] how long KEYS[7] is kept, ms (with ARGV[6])

  Output:
    1 submitted
    0 submitted already, by this very call: the client sent it again because the
      first reply was lost (a failover closes connections after the write); nothing
      written. SharedRunIds are random, so an existing record with the same creation
      time and tenant index entry is this submission's own.
    -1 the SharedRunId exists already as another submission's (nothing written)
    -2 the tenant's settings are not ARGV[5] any more (nothing written)
    {-3, KEYS[7]'s value} the idempotency key was used already, by the submission
      it names (nothing written): the caller answers with that run, or refuses the
      request when its fingerprint differs. Checked after the retry of this very call
      (0) and before the settings (a replay compiles nothing).
]]
if redis.call('EXISTS', KEYS[1]) == 1 then
  local created = redis.call('ZSCORE', KEYS[3], ARGV[1])
  if created and tonumber(created) == tonumber(ARGV[3]) then return 0 end
  return -1
end
if ARGV[6] ~= '' then
  local first = redis.call('GET', KEYS[7])
  if first then return {-3, first} end
end
if (redis.call('GET', KEYS[6]) or '') ~= ARGV[5] then return -2 end
if ARGV[6] ~= '' then redis.call('SET', KEYS[7], ARGV[6], 'PX', ARGV[7]) end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
redis.call('HSET', KEYS[5], ARGV[1], ARGV[4])
return 1
