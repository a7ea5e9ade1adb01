-- partition_probe: may the caller do what its first operation on a partition of a partitioned
-- job queue needs? Run on every partition before the queue's partition count is first
-- recorded, so a producer or worker that would be refused records nothing (a count left by a
-- refused process, possibly a wrong one, would lock out every correctly configured one), and
-- before a control that writes every partition (pause, resume, a backlog bound), so an
-- operator refused on one partition changes none. Writes nothing.
--
-- KEYS[1]  a partition's ready stream
-- KEYS[2]  its control hash
-- KEYS[3]  a deduplication key of the partition (only its name is used)
-- KEYS[4]  its staging stream (:scheduled)
-- KEYS[5]  its due index (:due)
-- KEYS[6]  its events stream
-- ARGV[1]  what comes first: 'enqueue' (job_enqueue), 'schedule' (job_schedule), 'worker'
--          (job_group, the consumer group check at worker start), 'pause' (job_pause, either
--          way) or 'backlog' (job_backlog set/clear); the last two check key types too
--
-- Returns 1. Errors: RESPIRE_NOPERM naming the first refused command, RESPIRE_ARGUMENT (a key
-- outside the caller's key patterns is refused by the server before the script runs: NOPERM).
--!include lib/preflight.lua

local ready, control, dedup, scheduled, due, events =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local mode = ARGV[1]
local perms
local types = {}
if mode == 'enqueue' then
  perms = {{'GET', dedup}, {'HGET', control, 'f'}, {'TYPE', ready}, {'XADD', ready, '*', 'f', 'v'},
           {'XDEL', ready, '0-1'}, {'SET', dedup, 'v', 'PX', '1'}}
elseif mode == 'schedule' then
  perms = {{'GET', dedup}, {'HGET', control, 'f'}, {'TYPE', scheduled},
           {'XADD', scheduled, '*', 'f', 'v'}, {'XDEL', scheduled, '0-1'}, {'ZADD', due, '0', 'm'},
           {'ZREM', due, 'm'}, {'SET', dedup, 'v', 'PX', '1'}, {'TIME'}}
elseif mode == 'worker' then
  perms = {{'TYPE', ready}, {'XGROUP', 'CREATE', ready, 'g', '0', 'MKSTREAM'},
           {'HSET', control, 'group.created', '1'}, {'EXISTS', ready}, {'XINFO', 'GROUPS', ready},
           {'HEXISTS', control, 'group.created'}}
elseif mode == 'pause' then
  types = {{control, 'hash'}, {events, 'stream'}}
  perms = {{'HSET', control, 'paused', '1'}, {'HDEL', control, 'paused'},
           {'XADD', events, '*', 'f', 'v'}, {'HGET', control, 'paused'}}
elseif mode == 'backlog' then
  types = {{control, 'hash'}}
  perms = {{'HGET', control, 'f'}, {'HSET', control, 'f', 'v'}, {'HDEL', control, 'f'}}
else
  return redis.error_reply('RESPIRE_ARGUMENT unknown probe mode')
end
local err = respire_preflight(types, perms)
if err then return err end
return 1
