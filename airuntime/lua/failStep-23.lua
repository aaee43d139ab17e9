--[[
  Record a failed attempt of an owned step. With attempts left (and a retryable
  error) the step waits for retry until next_retry_at = now + delay; otherwise it
  fails terminally: failure policy fail_fast stops new claims and finalizes Failed
  once running steps drained; continue skips only the step's descendants.

  Input:
    KEYS[1..21] the execution's keys
    KEYS[22] air:executions:active (of the execution's bucket) (finalizing removes the execution from it)
    KEYS[23] air:archive:outbox (of the execution's bucket) (finalizing queues the execution for the archiver)
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
    {-6, terminalStatus} the execution is already finalized (nothing changes)
    {status, 'retry', nextAttempt, nextRetryAtMs}
    {status, 'failed', attempt, 0}
]]
--- @include "execKeys"
--- @include "nowMs"
--- @include "emit"
--- @include "skipDescendants"
--- @include "refreshStatus"
--- @include "finalize"
--- @include "finishRecord"

local ek = execKeys(KEYS)
local m = redis.call('HMGET', ek.meta, 'done', 'terminal')
if not m[1] then return {-1} end
-- Finalized: the working hashes are gone (the snapshot holds the steps); nothing changes.
if m[2] and m[2] ~= '' then return {-6, m[2]} end
local worker, step, token = ARGV[1], ARGV[2], ARGV[3]
local st = redis.call('HGET', ek.status, step)
if not st then return {-2} end
if redis.call('HGET', ek.token, step) ~= token then
  emit(ek, 'type', 'failure_rejected', 'step', step, 'worker', worker, 'token', token, 'code', -3)
  return {-3}
end
if st ~= 'running' then return {-4} end

local now = nowMs()
local attempt = tonumber(redis.call('HGET', ek.attempt, step) or '1')
local maxAttempts = tonumber(redis.call('HGET', ek.maxAttempts, step) or '1')
redis.call('ZREM', ek.running, step)
redis.call('HINCRBY', ek.meta, 'running', -1)
redis.call('HSET', ek.err, step, ARGV[4])
redis.call('HSET', ek.owner, step, finishRecord(now, worker))

local outcome, nextAt = 'failed', 0
if ARGV[5] == '1' and attempt < maxAttempts then
  outcome = 'retry'
  nextAt = now + tonumber(ARGV[6])
  attempt = attempt + 1
  redis.call('HSET', ek.attempt, step, attempt)
  redis.call('HSET', ek.status, step, 'retry_wait')
  redis.call('HSET', ek.times, 'r:' .. step, nextAt)
  redis.call('ZADD', ek.delayed, nextAt, step)
  emit(ek, 'type', 'step_retry_scheduled', 'step', step, 'worker', worker, 'token', token,
    'next_attempt', attempt, 'next_retry_at', nextAt, 'error', ARGV[4])
else
  redis.call('HSET', ek.status, step, 'failed')
  redis.call('HINCRBY', ek.meta, 'failed', 1)
  redis.call('HINCRBY', ek.meta, 'done', 1)
  emit(ek, 'type', 'step_failed', 'step', step, 'worker', worker, 'token', token,
    'attempt', attempt, 'error', ARGV[4])
  if redis.call('HGET', ek.meta, 'failure_policy') == 'continue' then
    skipDescendants(ek, step)
  else
    redis.call('HSET', ek.meta, 'failing', 1)
  end
end
local status, mayEnd = refreshStatus(ek)
local final = mayEnd and finalizeIfDone(ek, now)
return {final or status, outcome, attempt, nextAt}
