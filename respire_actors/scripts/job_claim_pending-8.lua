-- job_claim_pending: recovery and startup replay in one bounded step.
--
-- KEYS[1]  ready stream
-- KEYS[2]  control hash
-- KEYS[3]  events stream
-- KEYS[4]  dead-letter stream
-- KEYS[5]  group policy (:group-policy)
-- KEYS[6]  lease owners (:group-owners)
-- KEYS[7]  concurrency leases (:group-leases)
-- KEYS[8]  parked groups (:group-parked)
-- ARGV[1]  consumer group
-- ARGV[2]  consumer name
-- ARGV[3]  mode: 'recover' (claim entries idle for at least ARGV[4] ms, from cursor ARGV[5];
--          XPENDING IDLE then XCLAIM per admitted entry)
--          or 'replay' (re-claim this consumer's own pending entries after ARGV[5])
-- ARGV[4]  minimum idle time in ms (recover mode): the caller's visibility timeout. It is
--          recorded in the control hash (lease.ms / lease.until) and, while another worker's
--          longer one is recorded there, that one is used instead (see respire_lease_floor in
--          lib/fence.lua: workers configured with different timeouts never claim each other's
--          running jobs)
-- ARGV[5]  cursor (an entry id; '0-0' to start)
-- ARGV[6]  page size (1 .. 1000)
-- ARGV[7]  delivery limit (0 = unlimited); counted as prior attempts + this entry's deliveries
-- ARGV[8]  acknowledgement: 'ack' (default, keep the body) or 'delete' (see lib/fence.lua)
-- ARGV[9]  optional metrics retention in minutes (0 = off, the default; 1 .. 1440: count the
--          delivery-limit dead letters as failed in <ready>:metrics, see lib/metrics.lua)
-- ARGV[10] optional crash-loop isolation: a delivery count (0 = off, the default) from which a
--          claimed entry is a suspect that must run alone: a page then holds one suspect and
--          nothing else (it ends before a suspect that is not its first entry, and right after
--          one that is), so no other entry is charged a delivery should the suspect crash its
--          worker (the worker runs it with no other handler; see actors/isolation.py)
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
-- Grouped jobs (_respire.job.group): the group's pause, concurrency limit and GCRA rate apply
-- to recovery and replay admissions too, checked before the entry is claimed. A blocked
-- entry is left as it is (not claimed, no attempt counted); in replay mode the pass ends there
-- (startup replay yields on a blocked group; recovery revisits it at its cadence). An admitted
-- grouped entry gets a new lease for its new attempt, replacing the old attempt's lease, so a
-- stale release of the old attempt frees nothing. Entries dead-lettered or expired here drop
-- their lease.
-- A flow node or batch member dead-lettered here fails in its flow or batch in the same step
-- (lib/coordination.lua); its event carries a 'flow' or 'batch' field. One whose coordination
-- state cannot be updated (unknown schema version, wrong key type) is left as it is, unclaimed,
-- and reported as {id, error} in a seventh reply element.
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM (before anything is claimed);
-- RESPIRE_CLAIM should a dead letter's acknowledgement still fail (that entry's writes undone).
--!include lib/preflight.lua
--!include lib/fence.lua
--!include lib/claim.lua
--!include lib/dead_letter.lua
--!include lib/group_lease.lua
--!include lib/coordination.lua
--!include lib/metrics.lua

local ready, control, events, dead = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local policy, owners, leases, parked = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local group, consumer, mode = ARGV[1], ARGV[2], ARGV[3]
local min_idle, cursor, count = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local limit = tonumber(ARGV[7])
if not count or count < 1 or count > 1000 or not limit or limit < 0 or not min_idle
   or min_idle < 0 or (mode ~= 'recover' and mode ~= 'replay') then
  return redis.error_reply('RESPIRE_ARGUMENT bad recovery arguments')
end
local ack_mode, merr = respire_ack_mode(ready, group, ARGV[8] or 'ack')
if not ack_mode then return merr end
local retention, rerr = respire_metrics_arg(ARGV[9])
if not retention then return rerr end
local alone_from = tonumber(ARGV[10] or '0')
if not alone_from or alone_from < 0 or alone_from % 1 ~= 0 then
  return redis.error_reply('RESPIRE_ARGUMENT bad recovery arguments')
end
-- Recovery waits for the longest visibility timeout a recovering worker recorded, and records
-- this worker's (lib/fence.lua). The record is a heartbeat, not part of the transition: it is
-- written on every recover call, paused or rate limited too, so it cannot lapse while the
-- queue is paused and its handlers still run.
if mode == 'recover' then
  local lerr = respire_preflight({{control, 'hash'}}, {{'HSET', control, 'lease.ms', '0'}})
  if lerr then return lerr end
  local own = min_idle
  min_idle = respire_lease_floor(control, own)
  respire_lease_record(control, own)
end
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
local probes = respire_admit_probes(respire_ack_probes(
  {{'XADD', events, '*', 'f', 'v'}, {'XADD', dead, '*', 'f', 'v'},
   {'XCLAIM', ready, group, consumer, '0', '0-1'}, {'HSET', policy, 'f', 'v'}},
  ready, group, ack_mode), control, window)
local err = respire_preflight(
  {{ready, 'stream'}, {events, 'stream'}, {dead, 'stream'}, {policy, 'hash'}, {owners, 'hash'},
   {leases, 'zset'}, {parked, 'zset'}},
  respire_lease_probes(respire_fence_probes(probes, ready, true), leases, owners, parked))
if not err then err = respire_metrics_preflight(ready, retention) end
if err then return err end
if redis.call('EXISTS', ready) == 0 then return {'ok', '0-0', {}, 0, 0, 0} end

-- The candidates, read without claiming: admission of grouped entries precedes their claim.
local rows = respire_claim_candidates(ready, group, consumer, mode, min_idle, cursor, count)
local next_cursor = '0-0'
if #rows == count then
  local last = rows[#rows][1]
  if mode == 'recover' then
    local ms, seq = string.match(last, '^(%d+)-(%d+)$')
    next_cursor = ms .. '-' .. string.format('%d', tonumber(seq) + 1)
  else
    next_cursor = last
  end
end

local coordinated = respire_coord_marked(ready)
local claimed, dead_count, expired, deleted, refused = {}, 0, 0, 0, {}
local now_ms = nil
local function now()
  if not now_ms then now_ms = respire_now_ms() end
  return now_ms
end
local claim_idle = 0
if mode == 'recover' then claim_idle = min_idle end
local function after(id)  -- the cursor that resumes the pass right after entry `id`
  if mode == 'replay' then return id end
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return ms .. '-' .. string.format('%d', tonumber(seq) + 1)
end
local previous = '0-0'  -- the row before this one (replay resumes after it)
for _, row in ipairs(rows) do
  local id, handled = row[1], tonumber(row[4])
  local fields = respire_entry(ready, id)
  local g = fields and respire_field(fields, '_respire.job.group')
  local prior = tonumber(respire_field(fields, '_respire.job.attempts') or '0') or 0
  local finishing = not fields or respire_expired(fields, now)
                    or (limit > 0 and prior + handled >= limit)
  local suspect = alone_from > 0 and handled + 1 >= alone_from and not finishing
  if suspect and #claimed > 0 then
    -- a suspect runs alone: the page ends before it, the next one starts with it
    if mode == 'replay' then next_cursor = previous else next_cursor = id end
    break
  end
  previous = id
  local p, reason, tat = nil, nil, nil
  local c, plan, perr = nil, nil, nil
  if coordinated and fields and limit > 0 and prior + handled >= limit
     and not respire_expired(fields, now) then
    c = respire_coord_of(ready, fields)
    plan, perr = respire_coord_plan(ready, events, c, 'failed', nil)
  end
  if perr then
    refused[#refused + 1] = {id, perr['err']}
  elseif g and not finishing then
    p = respire_group_policy(policy, g)
    reason, tat = respire_group_check(p, policy, leases, owners, g, now(), id)
  end
  if perr then
    -- left unclaimed: its coordination state must be repaired or upgraded first
  elseif reason then
    if mode == 'replay' then
      next_cursor = '0-0'  -- yield on a blocked group
      break
    end
  else
    local got = redis.call('XCLAIM', ready, group, consumer, claim_idle, id)
    local entry = got[1]
    if not fields or not entry or not entry[2] then
      if not fields then
        -- a PEL reference to a deleted body: clear it
        redis.call('XACK', ready, group, id)
        deleted = deleted + 1
      end
    elseif respire_expired(fields, now) then
      respire_ack(ready, group, ack_mode, id)
      if g then respire_group_drop(leases, owners, g, id); respire_group_nudge(parked, g) end
      expired = expired + 1
    elseif limit > 0 and prior + handled >= limit then
      local job_id = respire_field(fields, '_respire.job.id') or ''
      local dl, ev = nil, nil
      if plan and plan.as_cancelled then
        -- a member of a batch whose cancellation was requested: cancelled, not dead-lettered
        ev = redis.call('XADD', events, '*', unpack(respire_coord_tag(c,
          {'kind', 'cancelled', 'job_id', job_id, 'entry_id', id, 'attempt', tostring(handled)})))
      else
        dl = respire_dead_letter(dead, fields, nil, id, handled, 'delivery-limit', consumer)
        ev = redis.call('XADD', events, '*', unpack(respire_coord_tag(c,
          {'kind', 'dead-letter', 'job_id', job_id, 'entry_id', id,
           'attempt', tostring(handled), 'reason', 'delivery-limit'})))
      end
      local undo, aerr = respire_coord_apply(ready, events, plan)
      local ok, ackErr = false, aerr and aerr['err']
      if not aerr then ok, ackErr = pcall(respire_ack, ready, group, ack_mode, id) end
      if not ok then
        if not aerr then respire_coord_undo(ready, events, undo) end
        redis.call('XDEL', events, ev)
        if dl then redis.call('XDEL', dead, dl) end
        respire_metrics_record(ready, retention, 0, dead_count)
        return redis.error_reply('RESPIRE_CLAIM dead-lettering ' .. id .. ' failed: ' ..
                                 tostring(ackErr))
      end
      if g then respire_group_drop(leases, owners, g, id); respire_group_nudge(parked, g) end
      if dl then dead_count = dead_count + 1 end
    else
      if g then respire_group_take(policy, leases, owners, g, id, consumer, handled + 1, now(), p, tat) end
      claimed[#claimed + 1] = {id, fields, handled + 1}
      if suspect then  -- alone in its page: the next page starts after it
        next_cursor = after(id)
        break
      end
    end
  end
end
respire_admit_commit(control, window, #claimed)
respire_metrics_record(ready, retention, 0, dead_count)
if #refused > 0 then
  return {'ok', next_cursor, claimed, deleted, dead_count, expired, refused}
end
return {'ok', next_cursor, claimed, deleted, dead_count, expired}
