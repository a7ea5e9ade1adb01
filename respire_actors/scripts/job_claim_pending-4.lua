-- job_claim_pending: recovery and startup replay in one bounded step.
--
-- KEYS[1]  ready stream
-- KEYS[2]  control hash
-- KEYS[3]  events stream
-- KEYS[4]  dead-letter stream
-- ARGV[1]  consumer group
-- ARGV[2]  consumer name
-- ARGV[3]  mode: 'recover' (XAUTOCLAIM entries idle for at least ARGV[4] ms, from cursor ARGV[5])
--          or 'replay' (re-claim this consumer's own pending entries after ARGV[5])
-- ARGV[4]  minimum idle time in ms (recover mode)
-- ARGV[5]  cursor (an entry id; '0-0' to start)
-- ARGV[6]  page size (1 .. 1000)
-- ARGV[7]  delivery limit (0 = unlimited); counted as prior attempts + this entry's deliveries
-- ARGV[8]  acknowledgement: 'ack' (default, keep the body) or 'delete' (see lib/fence.lua)
--
-- Admission (pause, then the rate limit, which lowers the page size to the permits left) is
-- checked before anything is claimed, so a denied page changes no entry and counts no attempt.
-- When the window has no permits left but the page would find nothing to claim, the pass is
-- reported complete ({'ok', '0-0', {}, 0, 0, 0}) instead of 'limited'.
-- Returns {'paused'}, {'limited', retry_after_ms} or
-- {'ok', next_cursor, claimed, deleted_count, dead_count, expired_count} where claimed is a list
-- of {id, fields, deliveries}. Entries whose handlers already had the delivery limit (prior
-- attempts + deliveries before this claim >= ARGV[7]) are dead-lettered here (reason
-- delivery-limit, with a dead-letter event) and not returned; _respire.attempt (and the event's
-- attempt) is the number of deliveries handlers got, not counting this claim, the same number an
-- explicit or nack dead letter records; _respire.total_attempts adds _respire.job.attempts when
-- the job was durably retried. Entries whose TTL has
-- passed are acknowledged without event or dead letter and not returned. Only returned entries
-- use rate permits. PEL references to deleted bodies are cleared and counted. next_cursor '0-0'
-- means the pass is complete.
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM (before anything is claimed).
--!include lib/preflight.lua
--!include lib/fence.lua
--!include lib/claim.lua
--!include lib/dead_letter.lua

local ready, control, events, dead = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, consumer, mode = ARGV[1], ARGV[2], ARGV[3]
local min_idle, cursor, count = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local limit = tonumber(ARGV[7])
if not count or count < 1 or count > 1000 or not limit or limit < 0 or not min_idle
   or min_idle < 0 or (mode ~= 'recover' and mode ~= 'replay') then
  return redis.error_reply('RESPIRE_ARGUMENT bad recovery arguments')
end
local ack_mode, merr = respire_ack_mode(ready, group, ARGV[8] or 'ack')
if not ack_mode then return merr end
local status, allowed, window = respire_admit(control, count)
if status == 'paused' then return {'paused'} end
if status == 'limited' then
  -- A page with nothing to claim needs no permit: the pass is simply complete (a new worker's
  -- empty replay must not wait for a window with permits left).
  if redis.call('EXISTS', ready) == 0
     or not respire_claim_peek(ready, group, consumer, mode, min_idle, cursor) then
    return {'ok', '0-0', {}, 0, 0, 0}
  end
  return {'limited', allowed}
end
count = allowed
local err = respire_preflight(
  {{ready, 'stream'}, {events, 'stream'}, {dead, 'stream'}},
  respire_admit_probes(respire_ack_probes(
    {{'XADD', events, '*', 'f', 'v'}, {'XADD', dead, '*', 'f', 'v'}}, ready, group, ack_mode),
    control, window))
if err then return err end

local entries, next_cursor, deleted =
  respire_claim_page(ready, group, consumer, mode, min_idle, cursor, count)

local claimed, dead_count, expired = {}, 0, 0
local now_ms = nil
local function now()
  if not now_ms then now_ms = respire_now_ms() end
  return now_ms
end
for _, entry in ipairs(entries) do
  local id, fields = entry[1], entry[2]
  if fields and respire_expired(fields, now) then
    respire_ack(ready, group, ack_mode, id)
    expired = expired + 1
  elseif fields then
    local row = redis.call('XPENDING', ready, group, id, id, 1)[1]
    local deliveries = tonumber(row[4])
    -- This claim counted a delivery no handler will get: the handlers got one fewer.
    local handled = deliveries - 1
    local prior = tonumber(respire_field(fields, '_respire.job.attempts') or '0') or 0
    if limit > 0 and prior + handled >= limit then
      local job_id = respire_field(fields, '_respire.job.id') or ''
      respire_dead_letter(dead, fields, nil, id, handled, 'delivery-limit', consumer)
      redis.call('XADD', events, '*', 'kind', 'dead-letter', 'job_id', job_id, 'entry_id', id,
                 'attempt', tostring(handled), 'reason', 'delivery-limit')
      respire_ack(ready, group, ack_mode, id)
      dead_count = dead_count + 1
    else
      claimed[#claimed + 1] = {id, fields, deliveries}
    end
  else
    deleted = deleted + 1
  end
end
respire_admit_commit(control, window, #claimed)
return {'ok', next_cursor, claimed, deleted, dead_count, expired}
