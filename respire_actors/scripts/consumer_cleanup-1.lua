-- consumer_cleanup: remove consumers of a group that hold no pending entries, atomically.
--
-- KEYS[1]  the stream (a job queue's ready stream, or a stream worker's stream)
-- ARGV[1]  consumer group
-- ARGV[2]  mode: 'self' (remove consumer ARGV[3] if it has nothing pending: a clean shutdown)
--          or 'idle' (remove every other consumer idle at least ARGV[4] ms with nothing pending)
-- ARGV[3]  this process's consumer name ('self': the one to remove; 'idle': never removed)
-- ARGV[4]  'idle' mode: minimum idle time in ms (XINFO CONSUMERS 'idle'), at least 1
--
-- XGROUP DELCONSUMER drops a consumer's pending entries, so each removal is decided and done in
-- this one script: a consumer is removed only while XINFO CONSUMERS reports 0 pending for it,
-- and no delivery can arrive between that check and the removal. At most 1000 consumers are
-- removed per call. A missing stream or group removes nothing.
-- Returns the number of consumers removed.
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM (before any write).
--!include lib/preflight.lua

local stream = KEYS[1]
local group, mode, me = ARGV[1], ARGV[2], ARGV[3]
local min_idle = tonumber(ARGV[4] or '')
if not group or group == '' or not me or me == '' or (mode ~= 'self' and mode ~= 'idle')
   or (mode == 'idle' and (not min_idle or min_idle < 1)) then
  return redis.error_reply('RESPIRE_ARGUMENT bad consumer cleanup arguments')
end
local err = respire_preflight({{stream, 'stream'}},
  {{'XINFO', 'CONSUMERS', stream, group}, {'XGROUP', 'DELCONSUMER', stream, group, me}})
if err then return err end
if redis.call('EXISTS', stream) == 0 then return 0 end
local ok, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', stream, group)
if not ok then return 0 end -- NOGROUP: nothing to remove

local removed = 0
for _, c in ipairs(consumers) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  local name, pending, idle = info['name'], tonumber(info['pending']), tonumber(info['idle'])
  local wanted
  if mode == 'self' then
    wanted = name == me
  else
    wanted = name ~= me and idle ~= nil and idle >= min_idle
  end
  if wanted and pending == 0 and removed < 1000 then
    redis.call('XGROUP', 'DELCONSUMER', stream, group, name)
    removed = removed + 1
  end
end
return removed
