-- job_log: append one line to a job's capped log list, fenced like progress.
--
-- KEYS[1]  ready stream
-- KEYS[2]  log list of the job id
-- ARGV[1]  consumer group
-- ARGV[2]  consumer name
-- ARGV[3]  entry id
-- ARGV[4]  attempt (delivery count)
-- ARGV[5]  the line (valid UTF-8, size-checked by the caller)
-- ARGV[6]  maximum lines kept (1 .. 1000)
-- ARGV[7]  retention in ms (1 .. 2^31-1), set on the first append only
-- ARGV[8]  the job's absolute expiry in unix ms, or 0 for none
--
-- Returns 1 when appended; 0 when the delivery is not current (the fence failed: the caller's
-- lease is lost); 2 when the fence holds but the job's TTL has passed (nothing appended; the
-- TTL is not a cancellation deadline, so the delivery is still current).
-- The first append sets an expiry (retention, shortened to the job's expiry); later appends never
-- extend it. Errors: RESPIRE_WRONGTYPE, RESPIRE_NOPERM (for any command it runs; nothing
-- appended), RESPIRE_ARGUMENT.
--!include lib/preflight.lua
--!include lib/fence.lua

local ready, logs = KEYS[1], KEYS[2]
local max_lines, retention, expires = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
if not max_lines or max_lines < 1 or max_lines > 1000 or not retention or retention < 1
   or retention > 2147483647 or not expires then
  return redis.error_reply('RESPIRE_ARGUMENT bad log policy')
end
-- Every command the script runs is checked here, before the line is appended: PEXPIRETIME
-- after the append would otherwise leave a list that never expires.
local err = respire_preflight({{ready, 'stream'}, {logs, 'list'}},
  {{'XPENDING', ready, ARGV[1], '-', '+', '1'}, {'TIME'}, {'RPUSH', logs, 'x'},
   {'LTRIM', logs, '0', '-1'}, {'PEXPIRETIME', logs}, {'PEXPIREAT', logs, '1'}})
if err then return err end
if not respire_fence(ready, ARGV[1], ARGV[3], ARGV[2], ARGV[4]) then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if expires > 0 and now >= expires then return 2 end
redis.call('RPUSH', logs, ARGV[5])
redis.call('LTRIM', logs, -max_lines, -1)
if redis.call('PEXPIRETIME', logs) < 0 then
  local at = now + retention
  if expires > 0 and expires < at then at = expires end
  redis.call('PEXPIREAT', logs, at)
end
return 1
