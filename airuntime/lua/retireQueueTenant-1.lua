--[[
  Take a tenant out of the index of tenants whose shared queue may hold work, but only
  if nobody announced new work for it since the caller looked: the caller read the
  tenant's announce generation (its score), then found its queue empty (no pending,
  no claimed item), and passes that generation here. An enqueue announces the tenant
  (ZINCRBY) after its item is Pending, so either the generation moved and the tenant
  stays, or the announce comes after this removal and puts the tenant back: an item
  is never Pending while its tenant is missing from the index for good.

  Input:
    KEYS[1] the tenant index (air:{air}:squeue:tenants, score = announce generation)
    ARGV[1] tenant id
    ARGV[2] the generation the caller read

  Output:
    1 removed   0 kept (announced again since, or already gone)
]]
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
return 1
