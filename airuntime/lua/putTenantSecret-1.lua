--[[
  Store one secret of a tenant, within the tenant's cap on how many it may keep: a new
  name is refused when the tenant holds the cap already; replacing a value always works.

  Input:
    KEYS[1] air:{air}:tenant:<id>:secrets (hash: name -> record JSON)
    ARGV[1] the secret's name
    ARGV[2] its record (JSON: value, updated_at_ms, updated_by)
    ARGV[3] the most secrets the tenant may keep

  Output:
    1 created, 2 replaced, 0 refused: a new name and the tenant holds the cap already
]]
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return 2
end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
