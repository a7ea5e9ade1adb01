-- job_dead_retry: re-enqueue dead letters as new deliveries of their original jobs.
--
-- KEYS[1]  dead-letter stream
-- KEYS[2]  ready stream
-- ARGV[1..] dead-letter ids (1 .. 500 of them)
--
-- For each dead letter that exists and carries a job id and payload: append a new entry to the
-- ready stream with only its _respire.job.id, _respire.job.payload and, when present, its trace
-- context (_respire.trace.parent, _respire.trace.state); then delete the dead letter. Nothing
-- else is copied: no batch or flow membership (a retry never reopens a batch or flow), no group,
-- priority or expiry, no attempt count (the job starts afresh) and no dead-letter metadata.
-- The deduplication key of the job id is not consulted (a retry is deliberate).
-- Returns one value per id: the new ready entry id, 'missing' (no such dead letter) or
-- 'malformed' (no job id or payload; left in place).
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM before any write; should deleting
-- a dead letter still fail, its new ready entry is deleted again and RESPIRE_RETRY is returned
-- (the ids before it stay retried).
--!include lib/preflight.lua
--!include lib/fence.lua

local dead, ready = KEYS[1], KEYS[2]
if #ARGV < 1 or #ARGV > 500 then
  return redis.error_reply('RESPIRE_ARGUMENT job_dead_retry takes 1 .. 500 dead-letter ids')
end
for _, id in ipairs(ARGV) do
  if not string.match(id, '^%d+%-%d+$') then
    return redis.error_reply('RESPIRE_ARGUMENT malformed dead-letter id ' .. id)
  end
end
local err = respire_preflight({{dead, 'stream'}, {ready, 'stream'}},
  {{'XRANGE', dead, '-', '+', 'COUNT', '1'}, {'XDEL', dead, '0-1'},
   {'XADD', ready, '*', 'f', 'v'}, {'XDEL', ready, '0-1'}})
if err then return err end

local kept = {'_respire.job.id', '_respire.job.payload', '_respire.trace.parent',
              '_respire.trace.state'}
local out = {}
for _, id in ipairs(ARGV) do
  local fields = respire_entry(dead, id)
  if not fields then
    out[#out + 1] = 'missing'
  elseif not respire_field(fields, '_respire.job.id')
      or not respire_field(fields, '_respire.job.payload') then
    out[#out + 1] = 'malformed'
  else
    local copy = {}
    for _, name in ipairs(kept) do
      local value = respire_field(fields, name)
      if value then
        copy[#copy + 1] = name
        copy[#copy + 1] = value
      end
    end
    local added = redis.call('XADD', ready, '*', unpack(copy))
    local ok, delErr = pcall(redis.call, 'XDEL', dead, id)
    if not ok then
      redis.call('XDEL', ready, added)
      return redis.error_reply('RESPIRE_RETRY deleting dead letter ' .. id .. ' failed after ' ..
                               (#out) .. ' ids: ' .. tostring(delErr))
    end
    out[#out + 1] = added
  end
end
return out
