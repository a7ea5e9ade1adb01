-- job_group: create the ready stream's consumer group on a new queue; never recreate it at '0'
-- on a queue whose group existed before (that would run every retained, acknowledged job again).
--
-- KEYS[1]  ready stream
-- KEYS[2]  control hash (field 'group.created' records that this queue's group was created)
-- ARGV[1]  consumer group
-- ARGV[2]  'start' (a worker starting) or 'lost' (a running worker was told NOGROUP)
-- ARGV[3]  what to do when the group is missing on a queue that had one: 'fail', '$' or an
--          entry id to recreate it at
--
-- 'start' with no group and no 'group.created' mark is a new queue: the group is created at '0'
-- (MKSTREAM), so jobs enqueued before the first worker ran are delivered, and the mark is set.
-- A missing group with the mark set, or any missing group seen as 'lost', means the group
-- vanished: with 'fail' nothing is written and {'missing'} is returned; otherwise the group is
-- recreated at ARGV[3] and the mark kept.
-- Returns {'exists'}, {'created'}, {'recreated'} or {'missing'}.
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM (before any write); the server's
-- error for an id XGROUP CREATE refuses (nothing written).
--!include lib/preflight.lua

local ready, control = KEYS[1], KEYS[2]
local group, context, on_missing = ARGV[1], ARGV[2], ARGV[3]
if (context ~= 'start' and context ~= 'lost') or not on_missing or on_missing == ''
   or not group or group == '' then
  return redis.error_reply('RESPIRE_ARGUMENT bad consumer-group arguments')
end
local err = respire_preflight({{ready, 'stream'}, {control, 'hash'}},
  {{'XGROUP', 'CREATE', ready, group, '0', 'MKSTREAM'}, {'HSET', control, 'group.created', '1'}})
if err then return err end

if redis.call('EXISTS', ready) == 1 then
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', ready)) do
    for i = 1, #g, 2 do
      if g[i] == 'name' and g[i + 1] == group then
        redis.call('HSET', control, 'group.created', '1')
        return {'exists'}
      end
    end
  end
end
local marked = redis.call('HEXISTS', control, 'group.created') == 1
if context == 'start' and not marked then
  redis.call('XGROUP', 'CREATE', ready, group, '0', 'MKSTREAM')
  redis.call('HSET', control, 'group.created', '1')
  return {'created'}
end
if on_missing == 'fail' then return {'missing'} end
redis.call('XGROUP', 'CREATE', ready, group, on_missing, 'MKSTREAM')
redis.call('HSET', control, 'group.created', '1')
return {'recreated'}
