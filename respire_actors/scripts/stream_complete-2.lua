-- stream_complete: commit many outcomes for an application stream, each fenced.
--
-- KEYS[1]  the stream
-- KEYS[2]  dead-letter stream (same slot)
-- ARGV[1]  consumer group
-- ARGV[2]  consumer name
-- ARGV[3]  '1' to delete acknowledged entries (XDEL after XACK), '0' to keep them
-- ARGV[4]  n, the number of outcomes; then n groups of 4 values:
--          entry id, attempt (delivery count), kind ('ack' | 'dead'), dead-letter reason
--
-- For each outcome whose fence holds (pending for this consumer with this delivery count):
-- 'ack' acknowledges; 'dead' copies the entry plus _respire.source_id, _respire.attempt,
-- _respire.reason, _respire.consumer to the dead-letter stream, then acknowledges.
-- Returns one status per outcome: 1 committed, 0 stale (nothing written).
-- Errors: RESPIRE_WRONGTYPE / RESPIRE_NOPERM / RESPIRE_ARGUMENT before any write;
-- RESPIRE_COMPLETE if an acknowledgement fails (that outcome's dead letter is removed again).
--!include lib/preflight.lua
--!include lib/fence.lua
--!include lib/dead_letter.lua

local stream, dead = KEYS[1], KEYS[2]
local group, consumer, delete = ARGV[1], ARGV[2], ARGV[3] == '1'
local n = tonumber(ARGV[4])
if not n or n < 1 or #ARGV ~= 4 + n * 4 then
  return redis.error_reply('RESPIRE_ARGUMENT completion batch is malformed')
end
-- Every outcome is checked before the first write (a bad one later in the batch must not
-- leave the earlier ones committed).
local dead_letters = false
for i = 0, n - 1 do
  local base = 5 + i * 4
  local kind = ARGV[base + 2]
  if not tonumber(ARGV[base + 1]) or (kind ~= 'ack' and kind ~= 'dead') then
    return redis.error_reply('RESPIRE_ARGUMENT completion ' .. (i + 1) .. ' is malformed')
  end
  if kind == 'dead' then dead_letters = true end
end
-- The dead-letter stream is checked only for a batch that writes to it: a dead-letter key in a
-- bad state must not refuse plain acknowledgements (the completer retries a refused batch one
-- completion at a time, so the acks of a mixed batch still commit).
local perms = {{'XACK', stream, group, '0-1'}}
local types = {{stream, 'stream'}}
if dead_letters then
  perms[#perms + 1] = {'XADD', dead, '*', 'f', 'v'}
  perms[#perms + 1] = {'XDEL', dead, '0-1'}
  types[#types + 1] = {dead, 'stream'}
end
if delete then perms[#perms + 1] = {'XDEL', stream, '0-1'} end
local err = respire_preflight(types, respire_fence_probes(perms, stream, false))
if err then return err end

local statuses = {}
for i = 0, n - 1 do
  local base = 5 + i * 4
  local entry, attempt, kind, reason = ARGV[base], ARGV[base + 1], ARGV[base + 2], ARGV[base + 3]
  if not respire_fence(stream, group, entry, consumer, attempt) then
    statuses[#statuses + 1] = 0
  else
    local appended = nil
    if kind == 'dead' then
      appended = respire_dead_letter(dead, respire_entry(stream, entry), nil, entry, attempt,
                                     reason, consumer)
    end
    local ok, ackErr = pcall(redis.call, 'XACK', stream, group, entry)
    if not ok then
      if appended then redis.call('XDEL', dead, appended) end
      return redis.error_reply('RESPIRE_COMPLETE acknowledging ' .. entry .. ' failed: ' .. tostring(ackErr))
    end
    if delete then redis.call('XDEL', stream, entry) end
    statuses[#statuses + 1] = 1
  end
end
return statuses
