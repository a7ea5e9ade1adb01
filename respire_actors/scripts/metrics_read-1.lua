-- metrics_read: the per-minute completion counters of a job queue, oldest minute first.
--
-- KEYS[1]  the metrics hash (<ready>:metrics, see lib/metrics.lua)
-- ARGV[1]  how many minutes, ending with the current one (1 .. 1440)
--
-- Returns {} when the hash does not exist (metrics never enabled, or expired); else one
-- {minute, completed, failed} per minute (minute = unix ms / 60000 on the Redis clock), at most
-- ARGV[1] and at most the stored retention of them, ending with the current minute. A minute
-- whose slot holds another minute (reused, or never written) reads as zeros.
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE. Reads only (TIME, HGET).
--!include lib/preflight.lua
--!include lib/fence.lua

local key = KEYS[1]
local minutes = tonumber(ARGV[1])
if not minutes or minutes < 1 or minutes > 1440 or minutes % 1 ~= 0 then
  return redis.error_reply('RESPIRE_ARGUMENT minutes must be 1 .. 1440')
end
local err = respire_expect_type(key, 'hash') or respire_expect_perm('HGET', key, 'f')
if err then return err end
local retention = tonumber(redis.call('HGET', key, 'retention') or '')
if not retention or retention < 1 then return {} end
if minutes > retention then minutes = retention end
local now = math.floor(respire_now_ms() / 60000)
local out = {}
for minute = now - minutes + 1, now do
  local c, f = 0, 0
  local raw = redis.call('HGET', key, string.format('%d', minute % retention))
  if raw then
    local m, rc, rf = string.match(raw, '^(%d+):(%d+):(%d+)$')
    if tonumber(m) == minute then c, f = tonumber(rc), tonumber(rf) end
  end
  out[#out + 1] = {minute, c, f}
end
return out
