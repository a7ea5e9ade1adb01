-- stream_claim_pending: recovery and startup replay of an application stream, one page.
--
-- KEYS[1]  the stream
-- KEYS[2]  dead-letter stream (same slot)
-- ARGV[1]  consumer group
-- ARGV[2]  consumer name
-- ARGV[3]  mode: 'recover' (XAUTOCLAIM entries idle >= ARGV[4] ms from cursor ARGV[5]) or
--          'replay' (re-claim this consumer's own pending entries after cursor ARGV[5])
-- ARGV[4]  minimum idle time in ms
-- ARGV[5]  cursor ('0-0' to start)
-- ARGV[6]  page size (1 .. 1000)
-- ARGV[7]  delivery limit (0 = unlimited)
-- ARGV[8]  '1' to delete the entries dead-lettered here after acknowledging them (the worker's
--          delete_acknowledged, as stream_complete does), '0' (the default) to keep them
--
-- Returns {'ok', next_cursor, claimed, deleted_count, dead_count}; claimed is a list of
-- {id, fields, deliveries}. Entries whose handlers already had the limit (deliveries before this
-- claim >= ARGV[7]) are copied to the dead-letter stream (fields plus _respire.source_id,
-- _respire.attempt = the deliveries handlers got, _respire.reason=delivery-limit,
-- _respire.consumer) and acknowledged (and deleted with ARGV[8]), not returned. PEL references to deleted entries are
-- cleared and counted. Errors: RESPIRE_WRONGTYPE, RESPIRE_NOPERM, RESPIRE_ARGUMENT.
--!include lib/preflight.lua
--!include lib/claim.lua
--!include lib/dead_letter.lua

local stream, dead = KEYS[1], KEYS[2]
local group, consumer, mode = ARGV[1], ARGV[2], ARGV[3]
local min_idle, cursor, count = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local limit, delete = tonumber(ARGV[7]), ARGV[8] or '0'
if (mode ~= 'recover' and mode ~= 'replay') or not count or count < 1 or count > 1000
    or not limit or limit < 0 or not min_idle or min_idle < 0
    or (delete ~= '0' and delete ~= '1') or #ARGV > 8 then
  return redis.error_reply('RESPIRE_ARGUMENT bad recovery arguments')
end
delete = delete == '1'
local perms = {{'XACK', stream, group, '0-1'}}
if delete then perms[#perms + 1] = {'XDEL', stream, '0-1'} end
-- the claims are the first writes; the delivery counts are read after them
perms[#perms + 1] = {'XAUTOCLAIM', stream, group, consumer, '0', '0-0', 'COUNT', '1'}
perms[#perms + 1] = {'XCLAIM', stream, group, consumer, '0', '0-1'}
perms[#perms + 1] = {'XPENDING', stream, group, '-', '+', '1'}
local err = respire_preflight({{stream, 'stream'}}, perms)
if err then return err end
-- The dead-letter stream is checked only when this page holds an entry at the limit (its
-- delivery count before the claim, read without claiming): a dead-letter key in a bad state
-- must not stop the recovery of every other entry.
if limit > 0 then
  local rows = respire_claim_candidates(stream, group, consumer, mode, min_idle, cursor, count)
  for _, row in ipairs(rows) do
    if tonumber(row[4]) >= limit then
      err = respire_preflight({{dead, 'stream'}}, {{'XADD', dead, '*', 'f', 'v'}})
      if err then return err end
      break
    end
  end
end

local entries, next_cursor, deleted =
  respire_claim_page(stream, group, consumer, mode, min_idle, cursor, count)

local claimed, dead_count = {}, 0
for _, entry in ipairs(entries) do
  local id, fields = entry[1], entry[2]
  if fields then
    local deliveries = tonumber(redis.call('XPENDING', stream, group, id, id, 1)[1][4])
    -- this claim counted a delivery no handler will get: handlers got deliveries - 1
    if limit > 0 and deliveries - 1 >= limit then
      respire_dead_letter(dead, fields, nil, id, deliveries - 1, 'delivery-limit', consumer)
      redis.call('XACK', stream, group, id)
      if delete then redis.call('XDEL', stream, id) end
      dead_count = dead_count + 1
    else
      claimed[#claimed + 1] = {id, fields, deliveries}
    end
  else
    deleted = deleted + 1
  end
end
return {'ok', next_cursor, claimed, deleted, dead_count}
