--[[
  Record a failed attempt of an owned step. With attempts left (and a retryable
  error) the step waits for retry until next_retry_at = now + delay; otherwise it
  fails terminally: failure policy fail_fast stops new claims and finalizes Failed
  once running steps drained; continue skips only the step's descendants.

  Input:
    KEYS[1..21] the execution's keys
    ARGV[1] worker id
    ARGV[2] step id
    ARGV[3] claim token
    ARGV[4] error text
    ARGV[5] '1' retryable, '0' not
    ARGV[6] retry delay, milliseconds (computed by the caller from the retry policy
            with deterministic jitter)

  Output:
    {-1} execution not found   {-2} step not found
    {-3} stale claim token     {-4} step not Running
    {status, 'retry', nextAttempt, nextRetryAtMs}
    {status, 'failed', attempt, 0}
]]
--- @include "execKeys"
--- @include "nowMs"
--- @include "emit"
--- @include "enqueueReady"
--- @include "skipDescendants"
--- @include "refreshStatus"
--- @include "finalize"

if redis.call('EXISTS', metaKey) == 0 then return {-1} end
local worker, step, token = ARGV[1], ARGV[2], ARGV[3]
local st = redis.call('HGET', statusKey, step)
if not st then return {-2} end
if redis.call('HGET', tokenKey, step) ~= token then
  emit('type', 'failure_rejected', 'step', step, 'worker', worker, 'token', token, 'code', -3)
  return {-3}
end
if st ~= 'running' then return {-4} end

local now = nowMs()
local attempt = tonumber(redis.call('HGET', attemptKey, step) or '1')
local maxAttempts = tonumber(redis.call('HGET', maxAttemptsKey, step) or '1')
redis.call('ZREM', runningKey, step)
redis.call('HINCRBY', metaKey, 'running', -1)
redis.call('HSET', errKey, step, ARGV[4])
redis.call('HSET', ownerKey, step, worker)
redis.call('HSET', timesKey, 'f:' .. step, now)

local outcome, nextAt = 'failed', 0
if ARGV[5] == '1' and attempt < maxAttempts then
  outcome = 'retry'
  nextAt = now + tonumber(ARGV[6])
  attempt = attempt + 1
  redis.call('HSET', attemptKey, step, attempt)
  redis.call('HSET', statusKey, step, 'retry_wait')
  redis.call('HSET', timesKey, 'r:' .. step, nextAt)
  redis.call('ZADD', delayedKey, nextAt, step)
  emit('type', 'step_retry_scheduled', 'step', step, 'worker', worker, 'token', token,
    'next_attempt', attempt, 'next_retry_at', nextAt, 'error', ARGV[4])
else
  redis.call('HSET', statusKey, step, 'failed')
  redis.call('HINCRBY', metaKey, 'failed', 1)
  redis.call('HINCRBY', metaKey, 'done', 1)
  emit('type', 'step_failed', 'step', step, 'worker', worker, 'token', token,
    'attempt', attempt, 'error', ARGV[4])
  if redis.call('HGET', metaKey, 'failure_policy') == 'continue' then
    skipDescendants(step)
  else
    redis.call('HSET', metaKey, 'failing', 1)
  end
end
local status = refreshStatus()
local final = finalizeIfDone(now)
return {final or status, outcome, attempt, nextAt}
