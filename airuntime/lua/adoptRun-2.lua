--[[
  Move a run's ownership from a dead runtime instance to a live one, at most once:
  concurrent adopters race on this compare-and-set and only one wins. The owner must
  be dead *now*: its registry descriptor (which expires with its heartbeat) must be
  gone, so an instance that registered after the adopter listed the live ones keeps
  its runs.

  Input:
    KEYS[1] the run hash (air:{air}:run:<RunId>)
    KEYS[2] the registry descriptor of the owner believed dead (air:{air}:instance:<ARGV[1]>)
    ARGV[1] instance id the caller believes owns the run (dead)
    ARGV[2] adopting instance id
    ARGV[3] now, milliseconds (ledger only; the decision does not use time)

  Output:
    1 adopted
    0 not adopted: the run is gone, finished, owned by someone else now, or its owner
      is registered (alive)
]]
local runKey = KEYS[1]
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local owner = redis.call('HGET', runKey, 'instance_id')
if not owner or owner ~= ARGV[1] then return 0 end
local status = redis.call('HGET', runKey, 'status')
if status ~= 'queued' and status ~= 'running' then return 0 end
local adopted = redis.call('HGET', runKey, 'adopted_from')
if adopted then adopted = adopted .. ',' .. ARGV[1] else adopted = ARGV[1] end
redis.call('HSET', runKey, 'instance_id', ARGV[2], 'adopted_from', adopted, 'adopted_at_ms', ARGV[3])
return 1
