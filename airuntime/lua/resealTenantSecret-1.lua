--[[
  Replace one stored secret's record with the same value sealed under another key, only
  if the record is still the one read: a value set meanwhile (by the API, sealed by its
  setter) is left as it is.

  Input:
    KEYS[1] air:{air}:tenant:<id>:secrets (hash: name -> record JSON)
    ARGV[1] the secret's name
    ARGV[2] the record as read
    ARGV[3] the record sealed again

  Output:
    1 replaced, 0 the record changed (or went) meanwhile: nothing changes
]]
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
