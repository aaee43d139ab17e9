--[[
  Release a concurrency lease.

  Input:
    KEYS[1] the scope's holders zset
    ARGV[1] holder id

  Output:
    1 released, 0 it was not held (expired or never acquired)
]]
local holdersKey = KEYS[1]
return redis.call('ZREM', holdersKey, ARGV[1])
