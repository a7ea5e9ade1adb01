-- job_finish: commit one handler outcome, fenced, together with its retained outcome record
-- (result retention) and the dead-letter detail. job_complete commits plain outcomes in batches;
-- this script takes the outcomes that carry a record or a detail, one per call (pipelined).
--
-- KEYS[1]  ready stream
-- KEYS[2]  events stream
-- KEYS[3]  dead-letter stream
-- KEYS[4]  result record of the job id (hash)
-- KEYS[5]  concurrency leases (:group-leases)
-- KEYS[6]  lease owners (:group-owners)
-- KEYS[7]  parked groups (:group-parked)
-- ARGV[1]  consumer group
-- ARGV[2]  consumer name
-- ARGV[3]  entry id
-- ARGV[4]  attempt (delivery count)
-- ARGV[5]  kind: 'ack', 'dead' or 'cancelled' (a batch member skipped because its batch's
--          cancellation was requested: a cancelled event and a cancelled record)
-- ARGV[6]  dead-letter reason ('' for ack)
-- ARGV[7]  job id
-- ARGV[8]  dead-letter detail ('' for none; stored as _respire.detail and in the record)
-- ARGV[9]  retention of the record in ms (0: write no record; else 1 .. 2^31-1)
-- ARGV[10] result state: '' (none), 'value', 'result-too-large' or 'result-unencodable'
-- ARGV[11] the encoded result ('' unless the state is 'value')
-- ARGV[12] acknowledgement: 'ack' (keep the body) or 'delete' (decided per call, lib/fence.lua)
-- ARGV[13] '1' when the handler completed with a flow result (Job.complete), else '0'
-- ARGV[14] that result (at most 4096 bytes; '' otherwise)
-- ARGV[15] optional metrics retention in minutes (0 = off, the default; 1 .. 1440: count the
--          committed outcome in <ready>:metrics, see lib/metrics.lua); needs ARGV[13], ARGV[14]
--
-- When the fence holds: 'ack' appends a completed event, 'dead' appends the dead letter (as
-- job_complete does, plus _respire.detail when given) and a dead-letter event; with a retention
-- the record {state = completed | dead-lettered, entry_id, attempt, reason, detail,
-- result_state, result, finished_at (server ms)} replaces any older record of the job id and
-- expires after the retention; then the entry is acknowledged, and a grouped job's lease is
-- released when this consumer holds it for this attempt. A flow node or batch member also
-- updates its flow or batch (lib/coordination.lua; a flow node keeps ARGV[14] as its result when
-- ARGV[13] is '1'), and its event carries a 'flow' or 'batch' field. All of it or nothing.
-- Returns 1 committed, 0 stale (fence failed; nothing written). Repeating a call is harmless.
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM before any write. Should the
-- acknowledgement still fail, everything written is removed and RESPIRE_COMPLETE is returned.
--!include lib/preflight.lua
--!include lib/fence.lua
--!include lib/dead_letter.lua
--!include lib/group_lease.lua
--!include lib/coordination.lua
--!include lib/metrics.lua

local ready, events, dead, record = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local leases, owners, parked = KEYS[5], KEYS[6], KEYS[7]
local group, consumer, entry, attempt = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local kind, reason, job_id, detail = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local keep, state, result = tonumber(ARGV[9]), ARGV[10], ARGV[11]
if (#ARGV ~= 12 and #ARGV ~= 14 and #ARGV ~= 15)
   or (kind ~= 'ack' and kind ~= 'dead' and kind ~= 'cancelled') or not keep or keep < 0
   or (kind == 'cancelled' and state ~= '')
   or keep > 2147483647 or keep % 1 ~= 0 or #detail > 1024
   or (state ~= '' and state ~= 'value' and state ~= 'result-too-large'
       and state ~= 'result-unencodable') or (state ~= 'value' and result ~= '') then
  return redis.error_reply('RESPIRE_ARGUMENT malformed outcome')
end
local has_result, flow_result = ARGV[13] or '0', ARGV[14] or ''
if (has_result ~= '0' and has_result ~= '1') or #flow_result > 4096
   or (has_result == '0' and flow_result ~= '') or (has_result == '1' and kind ~= 'ack') then
  return redis.error_reply('RESPIRE_ARGUMENT malformed flow result')
end
if has_result == '0' then flow_result = nil end
local retention, rerr = respire_metrics_arg(ARGV[15])
if not retention then return rerr end
local ack_mode, merr = respire_ack_mode(ready, group, ARGV[12])
if not ack_mode then return merr end
local probes = {{'XADD', events, '*', 'f', 'v'}, {'XDEL', events, '0-1'}}
if kind == 'dead' then
  probes[#probes + 1] = {'XADD', dead, '*', 'f', 'v'}
  probes[#probes + 1] = {'XDEL', dead, '0-1'}
end
if keep > 0 then
  probes[#probes + 1] = {'HSET', record, 'f', 'v'}
  probes[#probes + 1] = {'PEXPIRE', record, '1'}
  probes[#probes + 1] = {'DEL', record}
end
local grouped = redis.call('EXISTS', owners) == 1
if grouped then respire_lease_probes(probes, leases, owners, parked) end
local err = respire_preflight(
  {{ready, 'stream'}, {events, 'stream'}, {dead, 'stream'}, {record, 'hash'}, {leases, 'zset'},
   {owners, 'hash'}, {parked, 'zset'}},
  respire_fence_probes(respire_ack_probes(probes, ready, group, ack_mode), ready, true))
if not err then err = respire_metrics_preflight(ready, retention) end
if err then return err end

if not respire_fence(ready, group, entry, consumer, attempt) then return 0 end

local coordinated = respire_coord_marked(ready)
local body = nil
if grouped or coordinated or kind == 'dead' then body = respire_entry(ready, entry) end
local c = coordinated and respire_coord_of(ready, body) or nil
local plan, perr = respire_coord_plan(ready, events, c, respire_coord_outcome(kind), flow_result)
if perr then return perr end

-- a batch member finishing after its batch's cancellation was requested counts as cancelled
-- whatever it returned: its event and record say so, no dead letter, no metrics
local cancelled = (plan and plan.as_cancelled) or kind == 'cancelled'
local appended_events, appended_dead = nil, nil
if cancelled then
  appended_events = redis.call('XADD', events, '*', unpack(respire_coord_tag(c,
    {'kind', 'cancelled', 'job_id', job_id, 'entry_id', entry, 'attempt', attempt})))
elseif kind == 'ack' then
  appended_events = redis.call('XADD', events, '*', unpack(respire_coord_tag(c,
    {'kind', 'completed', 'job_id', job_id, 'entry_id', entry, 'attempt', attempt})))
else
  local tail = nil
  if detail ~= '' then tail = {'_respire.detail', detail} end
  appended_dead = respire_dead_letter(dead, body, {'_respire.job.id', job_id},
                                      entry, attempt, reason, consumer, tail)
  appended_events = redis.call('XADD', events, '*', unpack(respire_coord_tag(c,
    {'kind', 'dead-letter', 'job_id', job_id, 'entry_id', entry, 'attempt', attempt,
     'reason', reason})))
end
if keep > 0 then
  redis.call('DEL', record)
  local outcome = kind == 'ack' and 'completed' or 'dead-lettered'
  if cancelled then outcome = 'cancelled' end
  local fields = {'state', outcome, 'job_id', job_id,
                  'entry_id', entry, 'attempt', attempt, 'reason', reason, 'detail', detail,
                  'result_state', state, 'finished_at', tostring(respire_now_ms())}
  if state == 'value' then
    fields[#fields + 1] = 'result'
    fields[#fields + 1] = result
  end
  redis.call('HSET', record, unpack(fields))
  redis.call('PEXPIRE', record, keep)
end
local undo, aerr = respire_coord_apply(ready, events, plan)
local ok, ackErr = false, aerr and aerr['err']
if not aerr then ok, ackErr = pcall(respire_ack, ready, group, ack_mode, entry) end
if not ok then
  if not aerr then respire_coord_undo(ready, events, undo) end
  if appended_events then redis.call('XDEL', events, appended_events) end
  if appended_dead then redis.call('XDEL', dead, appended_dead) end
  if keep > 0 then redis.call('DEL', record) end
  return redis.error_reply('RESPIRE_COMPLETE acknowledging ' .. entry .. ' failed: ' ..
                           tostring(ackErr))
end
local g = grouped and respire_field(body, '_respire.job.group')
if g then respire_group_release(leases, owners, parked, g, entry, consumer, attempt) end
if cancelled then
  respire_metrics_record(ready, retention, 0, 0)
elseif kind == 'ack' then
  respire_metrics_record(ready, retention, 1, 0)
else
  respire_metrics_record(ready, retention, 0, 1)
end
if cancelled and kind ~= 'cancelled' then return 3 end
return 1
