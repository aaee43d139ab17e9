--[[
  Move a run's ownership from a dead runtime instance to a live one, at most once:
  concurrent adopters race on this compare-and-set and only one wins. The caller
  checks just before that the owner is dead *now* (its registry descriptor, which
  expires with its heartbeat, is gone; RunIndex.adopt): the descriptor is in the
  control slot and the run in its bucket, another slot on a cluster. An owner that
  comes back in between finds the run is no longer its own (startRun refuses it; a
  running execution is fenced by the engine's claim tokens). The adopter names the
  status it decided on (ARGV[4]): a queued run that its owner, registered again right
  after the adopter's check, started meanwhile is running now and stays its owner's
  (adopting it would give it a second participation).

  Input:
    KEYS[1] the run hash (<bucket>:run:<RunId>)
    ARGV[1] instance id the caller believes owns the run (dead)
    ARGV[2] adopting instance id
    ARGV[3] now, milliseconds (ledger only; the decision does not use time)
    ARGV[4] the status the caller saw ('queued' | 'running'): the run must still have it

  Output:
    1 adopted (also to this very call sent again after a lost reply: the run is
      already the adopter's, from ARGV[1], at ARGV[3]; nothing written again)
    0 not adopted: the run is gone, finished, owned by someone else now, or no
      longer in the status the caller saw

]]
local runKey = KEYS[1]
local owner = redis.call('HGET', runKey, 'instance_id')
if owner and owner == ARGV[2] and owner ~= ARGV[1] then
  -- Sent again after its reply was lost? The same adopter, from the same dead owner,
  -- at the same caller time: this call's own write, so adopted, as the first call said.
  local from = redis.call('HGET', runKey, 'adopted_from') or ''
  local at = redis.call('HGET', runKey, 'adopted_at_ms')
  local last = string.match(from, '([^,]+)$')
  if at == ARGV[3] and last == ARGV[1] then return 1 end
  return 0
end
if not owner or owner ~= ARGV[1] then return 0 end
local status = redis.call('HGET', runKey, 'status')
if status ~= ARGV[4] or (status ~= 'queued' and status ~= 'running') then return 0 end
local adopted = redis.call('HGET', runKey, 'adopted_from')
if adopted then adopted = adopted .. ',' .. ARGV[1] else adopted = ARGV[1] end
redis.call('HSET', runKey, 'instance_id', ARGV[2], 'adopted_from', adopted, 'adopted_at_ms', ARGV[3])
return 1
