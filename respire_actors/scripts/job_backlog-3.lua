-- job_backlog: set, clear or read a job queue's backlog bound (producer backpressure, see
-- lib/backlog.lua for what the backlog counts).
--
-- KEYS[1]  control hash (field max_backlog)
-- KEYS[2]  ready stream
-- KEYS[3]  staging stream (:scheduled)
-- ARGV[1]  'set', 'clear' or 'read'
-- ARGV[2]  the bound for 'set' (1 .. 2^31-1)
--
-- Returns, for 'set' / 'clear', 1 when the stored bound changed, else 0; for 'read',
-- {backlog, bound} with bound -1 when none is set (exact; see respire_backlog_count).
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM (nothing written).
--!include lib/preflight.lua
--!include lib/backlog.lua

local control, ready, scheduled = KEYS[1], KEYS[2], KEYS[3]
local op = ARGV[1]
if op == 'read' then
  local limit, err = respire_backlog_limit(control)
  if err then return err end
  local backlog
  backlog, err = respire_backlog_count(ready, scheduled, nil)
  if err then return err end
  return {backlog, limit or -1}
end
local err = respire_preflight({{control, 'hash'}},
                              {{'HGET', control, 'f'}, {'HSET', control, 'f', 'v'},
                               {'HDEL', control, 'f'}})
if err then return err end
local current = redis.call('HGET', control, 'max_backlog')
if op == 'clear' then
  return redis.call('HDEL', control, 'max_backlog')
end
local limit = tonumber(ARGV[2])
if op ~= 'set' or not limit or limit < 1 or limit > 2147483647 or limit % 1 ~= 0 then
  return redis.error_reply('RESPIRE_ARGUMENT job_backlog takes set <1 .. 2^31-1>, clear or read')
end
local text = string.format('%d', limit)
if current == text then return 0 end
redis.call('HSET', control, 'max_backlog', text)
return 1
