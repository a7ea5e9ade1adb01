-- job_read: admit up to COUNT never-delivered jobs to this consumer, after the queue checks.
--
-- KEYS[1]  ready stream (consumer group ARGV[1] must exist)
-- KEYS[2]  control hash (pause flag, rate-limit policy and window usage; see lib/fence.lua)
-- ARGV[1]  consumer group
-- ARGV[2]  consumer name
-- ARGV[3]  count: how many entries local capacity admits (1 .. 1000)
-- ARGV[4]  expired entries are acknowledged and kept ('ack', default) or deleted ('delete';
--          XACKDEL where the server has it, else XACK + XDEL, decided here; see lib/fence.lua)
-- ARGV[5]  visibility timeout in ms (optional, 0 = none): under a rate policy, an entry idle this
--          long makes the read return {'recover', id, pace_ms} instead of reading new entries;
--          it is also recorded in the control hash (respire_lease_record in lib/fence.lua) so
--          workers with a shorter timeout do not claim what this read delivers
--
-- Admission (pause, then the rate limit) is checked before anything is claimed; the rate limit
-- lowers COUNT to the permits left in the current window and to a tenth of the window's permits
-- per call (pace_ms, a tenth of the window, is how long the reader should wait before its next
-- read; 0 without a policy), so concurrent readers share the window. Entries whose
-- _respire.job.expires_at has passed (server clock) are acknowledged here, without an event or
-- dead letter, and not returned; they use no rate permit.
-- Returns {'paused'}; {'limited', retry_after_ms} (the rest of the window; rate_limit_hits is
-- incremented); {'empty', last_id} where last_id is the newest entry id (or 0-0), to block on
-- with XREAD outside the script; {'recover', id, pace_ms} (see ARGV[5]; nothing claimed, no
-- permit used); or {'ok', entries, expired_count, pace_ms, drained_id} with entries as
-- XREADGROUP gives them ({id, {field, value, ...}}), each now pending for this consumer with
-- delivery count 1 (entries may be empty when every entry read had expired); drained_id is the
-- id of the last entry read when the read reached the end of the stream (it took fewer entries
-- than it asked for: that entry is the newest, so the caller can block for a newer one instead
-- of reading again), else ''.
-- Errors: NOGROUP when the consumer group is missing (see recreate_missing_group);
-- RESPIRE_ARGUMENT; RESPIRE_WRONGTYPE / RESPIRE_NOPERM before anything is claimed.
--!include lib/preflight.lua
--!include lib/fence.lua

local ready, control = KEYS[1], KEYS[2]
local group, consumer = ARGV[1], ARGV[2]
local count, mode, min_idle = respire_read_args(ready, group, ARGV[3], ARGV[4], ARGV[5])
if not count then return mode end
local early, allowed, pace, window = respire_read_admission(ready, control, group, count,
                                                             min_idle)
if early then return early end
-- TIME: an expiry is checked on the server clock after the entries were delivered
local probes = respire_admit_probes(respire_ack_probes({{'TIME'}}, ready, group, mode), control,
                                    window)
if min_idle > 0 then probes[#probes + 1] = {'HSET', control, 'lease.ms', '0'} end
local err = respire_preflight({{control, 'hash'}}, probes)
if err then return err end
-- the reader's visibility timeout, recorded before anything is delivered (lib/fence.lua)
respire_lease_record(control, min_idle)
local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', allowed,
                         'STREAMS', ready, '>')
if reply and reply[1] and #reply[1][2] > 0 then
  local entries, live, expired = reply[1][2], {}, 0
  local now_ms = nil
  local function now()
    if not now_ms then now_ms = respire_now_ms() end
    return now_ms
  end
  for _, entry in ipairs(entries) do
    if entry[2] and respire_expired(entry[2], now) then
      respire_ack(ready, group, mode, entry[1])
      expired = expired + 1
    else
      live[#live + 1] = entry
    end
  end
  respire_admit_commit(control, window, #live)
  local drained = ''
  if #entries < allowed then drained = entries[#entries][1] end
  return {'ok', live, expired, pace, drained}
end
local last = redis.call('XREVRANGE', ready, '+', '-', 'COUNT', 1)
if last[1] then return {'empty', last[1][1]} end
return {'empty', '0-0'}
