--[[
  Register or refresh a runtime instance: its descriptor, stamped with Redis time, with
  a TTL, and its entry in the instance index; entries whose heartbeat expired leave the
  index. Stamping here (not with the runtime's clock) is what lets admission compare a
  descriptor's age with reservations by Redis time only (reserveSlot-1.lua).

  Input:
    KEYS[1] the instance's descriptor (air:{air}:instance:<id>)
    KEYS[2] the instance index (air:{air}:instances, score = heartbeat expiry ms)
    ARGV[1] instance id
    ARGV[2] InstanceDescriptor JSON (compact, as pydantic writes it); the values of its
            heartbeat_at_ms and capacity.snapshot_at_ms are replaced by Redis time (as
            text: decoding and re-encoding would turn an empty list into an object)
    ARGV[3] heartbeat TTL, ms

  Output:
    {1, nowMs}  published; nowMs is the Redis time written into the descriptor
]]
--- @include "publishDescriptor"

return {1, publishDescriptor(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])}
