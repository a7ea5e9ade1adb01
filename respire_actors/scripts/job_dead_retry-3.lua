-- job_dead_retry: re-enqueue one dead letter as a new delivery of its original job.
--
-- KEYS[1]  dead-letter stream
-- KEYS[2]  ready stream
-- KEYS[3]  result record of the letter's job id (hash; keys.result(job id))
-- ARGV[1]  dead-letter id
-- ARGV[2]  the letter's job id, as the caller read it (KEYS[3] is its record)
--
-- When the dead letter exists and carries a job id and payload: append a new entry to the ready
-- stream with only its _respire.job.id, _respire.job.payload, when present its trace
-- context (_respire.trace.parent, _respire.trace.state), and _respire.replayed_from (the dead
-- letter's id, so the new entry names what it replays); delete the dead letter; delete the
-- job id's retained outcome record, so status() and result() wait for the new run instead of
-- answering with the dead-lettered one. Nothing else is copied: no batch or flow membership (a
-- retry never reopens a batch or flow), no group, priority or expiry, no attempt count (the job
-- starts afresh) and no other dead-letter metadata. The deduplication key of the job id is not
-- consulted (a retry is deliberate).
-- Returns the new ready entry id, 'missing' (no such dead letter), 'malformed' (no job id or
-- payload; left in place) or 'changed' (the letter's job id is not ARGV[2]: KEYS[3] is not its
-- record; nothing done).
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM before any write. The XADD is the
-- only write that can be refused (out of memory); should deleting the letter still fail, the new
-- ready entry is deleted again and RESPIRE_RETRY is returned.
--!include lib/preflight.lua
--!include lib/fence.lua

local dead, ready, record = KEYS[1], KEYS[2], KEYS[3]
local id, job_id = ARGV[1], ARGV[2]
if #ARGV ~= 2 or not string.match(id, '^%d+%-%d+$') or job_id == '' then
  return redis.error_reply('RESPIRE_ARGUMENT job_dead_retry takes a dead-letter id and job id')
end
local err = respire_preflight({{dead, 'stream'}, {ready, 'stream'}, {record, 'hash'}},
  {{'XRANGE', dead, '-', '+', 'COUNT', '1'}, {'XDEL', dead, '0-1'},
   {'XADD', ready, '*', 'f', 'v'}, {'XDEL', ready, '0-1'}, {'DEL', record}})
if err then return err end

local fields = respire_entry(dead, id)
if not fields then return 'missing' end
local found = respire_field(fields, '_respire.job.id')
if not found or not respire_field(fields, '_respire.job.payload') then return 'malformed' end
if found ~= job_id then return 'changed' end
local copy = {}
for _, name in ipairs({'_respire.job.id', '_respire.job.payload', '_respire.trace.parent',
                       '_respire.trace.state'}) do
  local value = respire_field(fields, name)
  if value then
    copy[#copy + 1] = name
    copy[#copy + 1] = value
  end
end
copy[#copy + 1] = '_respire.replayed_from'
copy[#copy + 1] = id
local added = redis.call('XADD', ready, '*', unpack(copy))
local ok, delErr = pcall(redis.call, 'XDEL', dead, id)
if not ok then
  redis.call('XDEL', ready, added)
  return redis.error_reply('RESPIRE_RETRY deleting dead letter ' .. id .. ' failed: ' ..
                           tostring(delErr))
end
redis.call('DEL', record)
return added
