-- job_complete: commit many handler outcomes in one call, each fenced by consumer and attempt.
--
-- KEYS[1]  ready stream
-- KEYS[2]  events stream
-- KEYS[3]  dead-letter stream
-- KEYS[4]  concurrency leases (:group-leases)
-- KEYS[5]  lease owners (:group-owners)
-- KEYS[6]  parked groups (:group-parked)
-- ARGV[1]  consumer group
-- ARGV[2]  consumer name
-- ARGV[3]  n, the number of outcomes; then n groups of 5 values:
--          entry id, attempt (delivery count), kind ('ack' | 'dead' | 'expired' | 'cancelled'),
--          dead-letter reason ('' unless dead), job id
-- ARGV[4..] the outcomes above, optionally followed by: 'ack' (default, keep acknowledged
--          bodies) or 'delete' (XACKDEL or XACK + XDEL, decided per call; see lib/fence.lua),
--          then optionally the metrics retention in minutes (0 = off, the default; 1 .. 1440:
--          count committed 'ack' as completed and 'dead' as failed in <ready>:metrics, see
--          lib/metrics.lua)
--
-- For each outcome whose fence holds: 'ack' appends a completed event and acknowledges;
-- 'dead' appends the envelope plus _respire.source_id/_respire.attempt/_respire.reason/
-- _respire.consumer to the dead-letter stream (plus _respire.total_attempts, this attempt plus
-- _respire.job.attempts, when the job was durably retried before), appends a dead-letter event, and acknowledges;
-- 'expired' only acknowledges (no event, no dead letter); 'cancelled' (a batch member skipped
-- because its batch's cancellation was requested) appends a cancelled event and acknowledges.
-- A flow node or batch member (lib/coordination.lua) also updates its flow or batch in the
-- same step: results, parent activation, counts, callbacks, their events; its own event carries
-- a 'flow' or 'batch' field. A batch member completing ('ack' or 'dead') after its batch's
-- cancellation was requested is committed as 'cancelled'. Every committed outcome of a grouped
-- job (_respire.job.group in its body) also releases its group lease when this consumer holds
-- it for this attempt (see lib/group_lease.lua), in the same execution.
-- Returns one status per outcome: 1 committed, 3 committed as 'cancelled' instead (a batch
-- member whose batch's cancellation was requested), 0 stale (fence failed: another delivery
-- owns the entry, or it was already completed; nothing written). Repeating a call is harmless.
-- Errors: RESPIRE_WRONGTYPE / RESPIRE_NOPERM before any write. A coordination error (unknown
-- schema version, a limit, a key of the wrong type: RESPIRE_SCHEMA, RESPIRE_LIMIT...) is returned
-- before that outcome's first write. Should an acknowledgement still fail, that outcome's new
-- events, dead letter and coordination writes are undone and RESPIRE_COMPLETE is returned;
-- outcomes before it stay committed (their statuses are in the error text).
--!include lib/preflight.lua
--!include lib/fence.lua
--!include lib/dead_letter.lua
--!include lib/group_lease.lua
--!include lib/coordination.lua
--!include lib/metrics.lua

local ready, events, dead = KEYS[1], KEYS[2], KEYS[3]
local leases, owners, parked = KEYS[4], KEYS[5], KEYS[6]
local group, consumer = ARGV[1], ARGV[2]
local n = tonumber(ARGV[3])
if not n or n < 1 or #ARGV < 3 + n * 5 or #ARGV > 5 + n * 5 then
  return redis.error_reply('RESPIRE_ARGUMENT completion batch is malformed')
end
local requested = ARGV[4 + n * 5] or 'ack'
local retention, rerr = respire_metrics_arg(ARGV[5 + n * 5])
if not retention then return rerr end
local ack_mode, merr = respire_ack_mode(ready, group, requested)
if not ack_mode then return merr end
local err = respire_preflight(
  {{ready, 'stream'}, {events, 'stream'}, {dead, 'stream'}, {leases, 'zset'}, {owners, 'hash'},
   {parked, 'zset'}},
  respire_fence_probes(respire_ack_probes(
    {{'XADD', events, '*', 'f', 'v'}, {'XDEL', events, '0-1'}, {'XADD', dead, '*', 'f', 'v'},
     {'XDEL', dead, '0-1'}}, ready, group, ack_mode), ready, true))
if not err then err = respire_metrics_preflight(ready, retention) end
if err then return err end
-- Leases exist only once a grouped job was delivered: ungrouped queues skip the body read.
local grouped = redis.call('EXISTS', owners) == 1
if grouped then
  err = respire_preflight({}, respire_lease_probes({}, leases, owners, parked))
  if err then return err end
end

for i = 0, n - 1 do
  local kind = ARGV[6 + i * 5]
  if kind ~= 'ack' and kind ~= 'dead' and kind ~= 'expired' and kind ~= 'cancelled' then
    return redis.error_reply('RESPIRE_ARGUMENT unknown outcome kind ' .. tostring(kind))
  end
end
-- Bodies are read for coordination only on queues that have (had) flows or batches.
local coordinated = respire_coord_marked(ready)

local statuses = {}
local completed, failed = 0, 0
for i = 0, n - 1 do
  local base = 4 + i * 5
  local entry, attempt, kind = ARGV[base], ARGV[base + 1], ARGV[base + 2]
  local reason, job_id = ARGV[base + 3], ARGV[base + 4]
  if not respire_fence(ready, group, entry, consumer, attempt) then
    statuses[#statuses + 1] = 0
  else
    local body = nil
    if grouped or coordinated or kind == 'dead' then body = respire_entry(ready, entry) end
    local c = coordinated and respire_coord_of(ready, body) or nil
    local plan, perr = respire_coord_plan(ready, events, c, respire_coord_outcome(kind), nil)
    if perr then return perr end
    -- a batch member finishing after its batch's cancellation was requested counts as
    -- cancelled whatever it returned: its event says so, no dead letter, no metrics
    local as_cancelled = plan and plan.as_cancelled and kind ~= 'cancelled'
    if as_cancelled then kind = 'cancelled' end
    local appended_events, appended_dead = nil, nil
    if kind == 'ack' then
      appended_events = redis.call('XADD', events, '*', unpack(respire_coord_tag(c,
        {'kind', 'completed', 'job_id', job_id, 'entry_id', entry, 'attempt', attempt})))
    elseif kind == 'cancelled' then
      appended_events = redis.call('XADD', events, '*', unpack(respire_coord_tag(c,
        {'kind', 'cancelled', 'job_id', job_id, 'entry_id', entry, 'attempt', attempt})))
    elseif kind == 'dead' then
      appended_dead = respire_dead_letter(dead, body,
                                          {'_respire.job.id', job_id}, entry, attempt, reason,
                                          consumer)
      appended_events = redis.call('XADD', events, '*', unpack(respire_coord_tag(c,
        {'kind', 'dead-letter', 'job_id', job_id, 'entry_id', entry, 'attempt', attempt,
         'reason', reason})))
    end
    local undo, aerr = respire_coord_apply(ready, events, plan)
    local ok, ackErr = false, aerr and aerr['err']
    if not aerr then ok, ackErr = pcall(respire_ack, ready, group, ack_mode, entry) end
    if not ok then
      if not aerr then respire_coord_undo(ready, events, undo) end
      if appended_events then redis.call('XDEL', events, appended_events) end
      if appended_dead then redis.call('XDEL', dead, appended_dead) end
      respire_metrics_record(ready, retention, completed, failed)
      return redis.error_reply('RESPIRE_COMPLETE acknowledging ' .. entry .. ' failed after ' ..
                               table.concat(statuses, ',') .. ': ' .. tostring(ackErr))
    end
    local g = grouped and respire_field(body, '_respire.job.group')
    if g then respire_group_release(leases, owners, parked, g, entry, consumer, attempt) end
    if kind == 'ack' then completed = completed + 1 end
    if kind == 'dead' then failed = failed + 1 end
    statuses[#statuses + 1] = as_cancelled and 3 or 1
  end
end
respire_metrics_record(ready, retention, completed, failed)
return statuses
