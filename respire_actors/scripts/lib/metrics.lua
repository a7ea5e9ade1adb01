-- Per-minute completion counters in Redis (QueueOptions.metrics_retention_minutes), committed by
-- the completion scripts in the same execution as the terminal events and acknowledgements.
--
-- One hash at <ready>:metrics (derived from the ready key: same slot, same client prefix):
--   field '<minute mod retention>' = '<minute>:<completed>:<failed>'  (minute = unix ms / 60000
--                                     on the Redis clock; a slot is reused once its minute left
--                                     the window, so the hash holds at most `retention` slots)
--   field 'retention'              = the retention in minutes (all workers must agree)
-- The hash expires when the last recorded minute leaves the window (PEXPIREAT), idle or not.
-- Completed counts acknowledged successes; failed counts terminal dead letters. Retries,
-- expiries, cancelled batch members and flow parents failed without running are not counted.

local function respire_metrics_key(ready)
  return ready .. ':metrics'
end

-- The retention argument (0 = off, 1 .. 1440). Returns the number, or nil and an error reply.
local function respire_metrics_arg(value)
  local r = tonumber(value or '0')
  if not r or r < 0 or r > 1440 or r % 1 ~= 0 then
    return nil, redis.error_reply('RESPIRE_ARGUMENT metrics retention must be 0 .. 1440 minutes')
  end
  return r, nil
end

-- Preflight of the metrics hash (type and the commands recording uses); nil when fine.
local function respire_metrics_preflight(ready, retention)
  if retention == 0 then return nil end
  local key = respire_metrics_key(ready)
  return respire_preflight({{key, 'hash'}},
    {{'HGET', key, 'f'}, {'HSET', key, 'f', 'v'}, {'PEXPIREAT', key, '1'}})
end

-- Adds `completed` and `failed` to the current minute's slot. The layout is the stored one
-- when the hash has one: workers that started together on a fresh queue with different
-- retentions (the start-up check found no hash to compare with) still count into one layout.
local function respire_metrics_record(ready, retention, completed, failed)
  if retention == 0 or (completed == 0 and failed == 0) then return end
  local key = respire_metrics_key(ready)
  local stored = tonumber(redis.call('HGET', key, 'retention') or '')
  if stored and stored >= 1 and stored <= 1440 and stored % 1 == 0 then retention = stored end
  local minute = math.floor(respire_now_ms() / 60000)
  local slot = string.format('%d', minute % retention)
  local c, f = 0, 0
  local old = redis.call('HGET', key, slot)
  if old then
    local m, oc, of = string.match(old, '^(%d+):(%d+):(%d+)$')
    if tonumber(m) == minute then c, f = tonumber(oc), tonumber(of) end
  end
  redis.call('HSET', key, slot, string.format('%d:%d:%d', minute, c + completed, f + failed),
             'retention', string.format('%d', retention))
  redis.call('PEXPIREAT', key, string.format('%d', (minute + retention) * 60000))
end
