-- job_retry: durable retries: stage a new entry for each delivery and acknowledge it, fenced.
--
-- KEYS[1]  ready stream
-- KEYS[2]  staging stream (:scheduled)
-- KEYS[3]  due-time index (:due)
-- KEYS[4]  staged grouped jobs (:group-jobs)
-- KEYS[5]  group rotation (:group-order)
-- KEYS[6]  concurrency leases (:group-leases)
-- KEYS[7]  lease owners (:group-owners)
-- KEYS[8]  parked groups (:group-parked)
-- KEYS[9]  group policy (:group-policy; counts staged jobs with a nonzero priority)
-- ARGV[1]  consumer group
-- ARGV[2]  consumer name
-- ARGV[3]  acknowledgement: 'ack' (keep the body) or 'delete' (decided per call; lib/fence.lua)
-- ARGV[4]  n, the number of retries; then n groups of 4 values:
--          entry id, attempt (delivery count), delay in ms (0 .. 2^31-1), reason code (why the
--          attempt failed: 'processing-failed', 'retry-after'...; '' for none, at most 256 bytes)
-- ARGV[5..] the retries above
--
-- For each retry whose fence holds (pending for this consumer with this delivery count, body
-- present): stage a copy of the entry (job id, payload, priority, group and absolute expiry kept)
-- with _respire.job.attempts raised by this entry's delivery count, _respire.retry.previous_id
-- set to this entry's id and _respire.retry.reason to the reason code (the attempt's
-- provenance: the last retry's, replacing an earlier one's), due at server time + delay,
-- and acknowledge the current entry. When the job's expiry comes no later than that due time the
-- entry is only acknowledged (it would expire staged). A grouped job (_respire.job.group) is
-- indexed in :group-jobs at its new due time (its group rejoins the rotation unless parked)
-- instead of :due, and the delivery's group lease is released when this consumer holds it for
-- this attempt.
-- Returns one status per retry: 1 staged, 2 acknowledged as expired, 0 stale (fence failed or
-- body deleted; nothing written). Repeating a call is harmless: the fence fails the second time.
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM before any write; should indexing
-- or acknowledging still fail, that retry's staging is undone and RESPIRE_RETRY is returned with
-- the statuses of the retries before it (which stay committed).
--!include lib/preflight.lua
--!include lib/fence.lua
--!include lib/group_lease.lua

local ready, scheduled, due = KEYS[1], KEYS[2], KEYS[3]
local jobs, order, leases, owners, parked = KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local policy = KEYS[9]
local group, consumer = ARGV[1], ARGV[2]
local n = tonumber(ARGV[4])
if not n or n < 1 or #ARGV ~= 4 + n * 4 then
  return redis.error_reply('RESPIRE_ARGUMENT retry batch is malformed')
end
local ack_mode, merr = respire_ack_mode(ready, group, ARGV[3])
if not ack_mode then return merr end
for i = 0, n - 1 do
  local delay = tonumber(ARGV[7 + i * 4])
  if not delay or delay < 0 or delay > 2147483647 or delay % 1 ~= 0 then
    return redis.error_reply('RESPIRE_ARGUMENT retry delay out of range')
  end
  if #ARGV[8 + i * 4] > 256 then
    return redis.error_reply('RESPIRE_ARGUMENT retry reason longer than 256 bytes')
  end
end
local err = respire_preflight(
  {{ready, 'stream'}, {scheduled, 'stream'}, {due, 'zset'}, {jobs, 'zset'}, {order, 'zset'},
   {leases, 'zset'}, {owners, 'hash'}, {parked, 'zset'}, {policy, 'hash'}},
  respire_lease_probes(
    respire_ack_probes({{'XADD', scheduled, '*', 'f', 'v'}, {'XDEL', scheduled, '0-1'},
                        {'ZADD', due, '0', 'm'}, {'ZREM', due, 'm'}, {'ZADD', jobs, '0', 'm'},
                        {'ZREM', jobs, 'm'}, {'ZADD', order, '0', 'm'},
                        {'HINCRBY', policy, 'f', '1'}, {'HDEL', policy, 'f'}}, ready, group, ack_mode),
    leases, owners, parked))
if not err then err = respire_preflight({}, respire_fence_probes({}, ready, true)) end
if err then return err end

local now = respire_now_ms()
local statuses = {}
for i = 0, n - 1 do
  local entry, attempt, delay = ARGV[5 + i * 4], ARGV[6 + i * 4], tonumber(ARGV[7 + i * 4])
  local reason = ARGV[8 + i * 4]
  local fields = nil
  if respire_fence(ready, group, entry, consumer, attempt) then
    fields = respire_entry(ready, entry)
  end
  if not fields then
    statuses[#statuses + 1] = 0
  else
    local due_at = now + delay
    local expires = tonumber(respire_field(fields, '_respire.job.expires_at') or '')
    local staged, index, member, prio = nil, due, nil, 0
    local g = respire_field(fields, '_respire.job.group')
    if not (expires and expires > 0 and expires <= due_at) then
      local copy, prior = {}, 0
      for j = 1, #fields, 2 do
        if fields[j] == '_respire.job.attempts' then
          prior = tonumber(fields[j + 1]) or 0
        elseif fields[j] == '_respire.retry.previous_id' or fields[j] == '_respire.retry.reason' then
          -- an earlier retry's provenance: replaced by this one's below
        else
          copy[#copy + 1] = fields[j]
          copy[#copy + 1] = fields[j + 1]
        end
      end
      copy[#copy + 1] = '_respire.job.attempts'
      copy[#copy + 1] = string.format('%d', prior + tonumber(attempt))
      copy[#copy + 1] = '_respire.retry.previous_id'
      copy[#copy + 1] = entry
      if reason ~= '' then
        copy[#copy + 1] = '_respire.retry.reason'
        copy[#copy + 1] = reason
      end
      staged = redis.call('XADD', scheduled, '*', unpack(copy))
      local ok, zErr
      if g then
        index = jobs
        prio = tonumber(respire_field(fields, '_respire.job.priority') or '0') or 0
        member = respire_job_member(g, due_at, staged, prio)
        ok, zErr = pcall(function()
          redis.call('ZADD', jobs, 0, member)
          respire_group_staged(order, parked, g, due_at)
        end)
      else
        member = staged
        ok, zErr = pcall(redis.call, 'ZADD', due, string.format('%d', due_at), staged)
      end
      if not ok then
        redis.call('ZREM', index, member)
        redis.call('XDEL', scheduled, staged)
        return redis.error_reply('RESPIRE_RETRY indexing the retry of ' .. entry .. ' failed after ' ..
                                 table.concat(statuses, ',') .. ': ' .. tostring(zErr))
      end
    end
    local ok, ackErr = pcall(respire_ack, ready, group, ack_mode, entry)
    if not ok then
      if staged then
        redis.call('ZREM', index, member)
        redis.call('XDEL', scheduled, staged)
      end
      return redis.error_reply('RESPIRE_RETRY acknowledging ' .. entry .. ' failed after ' ..
                               table.concat(statuses, ',') .. ': ' .. tostring(ackErr))
    end
    if g then
      if staged then respire_prio_count(policy, g, prio, 1) end
      respire_group_release(leases, owners, parked, g, entry, consumer, attempt)
    end
    if staged then statuses[#statuses + 1] = 1 else statuses[#statuses + 1] = 2 end
  end
end
return statuses
