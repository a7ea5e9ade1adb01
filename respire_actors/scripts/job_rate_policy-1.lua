-- job_rate_policy: read, initialise, change or remove a queue's fixed-window rate limit.
--
-- KEYS[1]  control hash (rate.limit, rate.window, rate.window_start, rate.used, rate_limit_hits)
-- ARGV[1]  'set' (store ARGV[2]/ARGV[3]), 'clear' (remove the policy) or 'init' (store when
--          absent, else compare)
-- ARGV[2]  permit limit per window (1 .. 2^31-1; 'set' and 'init')
-- ARGV[3]  window length in ms (1 .. 2^31-1; 'set' and 'init')
--
-- 'set' keeps the admissions already counted in the current window: when the window length
-- changes, the usage moves to the new window containing the current server time.
-- Returns for 'set' / 'clear': 1 when the stored policy changed, 0 when it was already so;
-- for 'init': {'stored'}, {'match'} or {'mismatch', stored_limit, stored_window_ms}.
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM (nothing written).
--!include lib/preflight.lua
--!include lib/fence.lua

local control = KEYS[1]
local action = ARGV[1]
local max = 2147483647
if action ~= 'set' and action ~= 'clear' and action ~= 'init' then
  return redis.error_reply('RESPIRE_ARGUMENT action must be set, clear or init')
end
local limit, window = tonumber(ARGV[2] or ''), tonumber(ARGV[3] or '')
if action ~= 'clear' and (not limit or limit < 1 or limit > max or limit % 1 ~= 0 or not window
   or window < 1 or window > max or window % 1 ~= 0) then
  return redis.error_reply('RESPIRE_ARGUMENT permit limit and window must be 1 .. 2^31-1')
end
local err = respire_preflight({{control, 'hash'}},
  {{'HSET', control, 'rate.limit', '1'}, {'HDEL', control, 'rate.limit'},
   {'HMGET', control, 'rate.limit'}, {'TIME'}})
if err then return err end
local c = redis.call('HMGET', control, 'rate.limit', 'rate.window', 'rate.window_start')
local old_limit, old_window = tonumber(c[1] or ''), tonumber(c[2] or '')
if action == 'clear' then
  if not old_limit then return 0 end
  redis.call('HDEL', control, 'rate.limit', 'rate.window', 'rate.window_start', 'rate.used')
  return 1
end
if action == 'init' then
  if not old_limit then
    redis.call('HSET', control, 'rate.limit', string.format('%d', limit),
               'rate.window', string.format('%d', window))
    return {'stored'}
  end
  if old_limit == limit and old_window == window then return {'match'} end
  return {'mismatch', string.format('%d', old_limit), string.format('%d', old_window or 0)}
end
if old_limit == limit and old_window == window then return 0 end
local start = tonumber(c[3] or '')
if old_window and start and old_window ~= window then
  local now = respire_now_ms()
  if now < start + old_window then
    redis.call('HSET', control, 'rate.window_start', string.format('%d', now - (now % window)))
  else
    redis.call('HDEL', control, 'rate.window_start', 'rate.used')
  end
end
redis.call('HSET', control, 'rate.limit', string.format('%d', limit),
           'rate.window', string.format('%d', window))
return 1
