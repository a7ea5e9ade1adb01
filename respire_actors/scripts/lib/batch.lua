-- Batches: the state codec and the pure transitions shared by the batch scripts (batch_create,
-- batch_add, batch_seal, batch_status, batch_check, batch_remove) and the completion scripts
-- (through lib/coordination.lua). Nothing here writes: callers write and compensate.
-- Needs lib/preflight.lua included before it.
--
-- State: a STRING at <base>:batch:<sha1hex(batch id)>, a cmsgpack map:
--   v          schema version, 1 (any other value: RESPIRE_SCHEMA from every reader, no change)
--   id         the batch id (checked against the caller's id: a mismatch is corrupt state)
--   m          member job id -> 0 pending | 1 succeeded | 2 failed | 3 cancelled
--   n          number of members; pending / succeeded / failed / cancelled: counts by status
--   bytes      combined member/callback ids and serialized payloads (bytes)
--   sealed     no new members; cancel: cancellation requested; done: callbacks published
--   outcome    '' until done, then 'succeeded' | 'failed'
--   on_success / on_failure / on_complete   {job id, payload} or false (never nil in a table)

local RESPIRE_BATCH = {
  max_members = 256,
  max_bytes = 262144,
  codes = {completed = 1, failed = 2, cancelled = 3},
}

-- A new, open state for `id` with its callbacks ({job id, payload} or false each).
local function respire_batch_new(id, on_success, on_failure, on_complete)
  local bytes = 0
  for _, cb in ipairs({on_success or {'', ''}, on_failure or {'', ''}, on_complete or {'', ''}}) do
    bytes = bytes + #cb[1] + #cb[2]
  end
  return {v = 1, id = id, m = {}, n = 0, pending = 0, succeeded = 0, failed = 0,
          cancelled = 0, bytes = bytes, sealed = false, cancel = false, done = false,
          outcome = '', on_success = on_success or false, on_failure = on_failure or false,
          on_complete = on_complete or false}
end

local function respire_batch_corrupt(key, why)
  return redis.error_reply('RESPIRE_CORRUPT batch state ' .. key .. ' ' .. why)
end

-- Decodes a stored state. Returns the table, or nil and the error reply: RESPIRE_SCHEMA for an
-- unknown version, RESPIRE_CORRUPT for anything that is not a version-1 state of `id`.
local function respire_batch_decode(key, raw, id)
  local ok, s = pcall(cmsgpack.unpack, raw)
  if not ok or type(s) ~= 'table' then return nil, respire_batch_corrupt(key, 'is not msgpack') end
  if s.v ~= 1 then
    return nil, redis.error_reply('RESPIRE_SCHEMA batch state ' .. key .. ' has schema version '
                                  .. tostring(s.v) .. '; this version reads 1')
  end
  if s.id ~= id then return nil, respire_batch_corrupt(key, 'belongs to another batch id') end
  if type(s.m) ~= 'table' or type(s.n) ~= 'number' or type(s.pending) ~= 'number'
     or type(s.succeeded) ~= 'number' or type(s.failed) ~= 'number'
     or type(s.cancelled) ~= 'number' or type(s.bytes) ~= 'number'
     or type(s.sealed) ~= 'boolean' or type(s.cancel) ~= 'boolean'
     or type(s.done) ~= 'boolean' then
    return nil, respire_batch_corrupt(key, 'is missing fields')
  end
  return s, nil
end

-- Reads the state of batch `id` at `key` (reads only). Returns raw, state (both nil when the
-- batch is unknown or removed), or nil, nil, error reply (wrong key type, ACL, schema, corrupt).
local function respire_batch_load(key, id)
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' and raw.err then
    return nil, nil, respire_expect_type(key, 'string') or respire_expect_perm('GET', key)
      or redis.error_reply(raw.err)
  end
  if not raw then return nil, nil, nil end
  local s, err = respire_batch_decode(key, raw, id)
  if err then return nil, nil, err end
  return raw, s, nil
end

local function respire_batch_encode(s)
  return cmsgpack.pack(s)
end

-- Whether `extra` more members and `bytes` more bytes fit: nil, or 'members' / 'bytes'.
local function respire_batch_room(s, extra, bytes)
  if s.n + extra > RESPIRE_BATCH.max_members then return 'members' end
  if s.bytes + bytes > RESPIRE_BATCH.max_bytes then return 'bytes' end
  return nil
end

-- Completes a sealed batch with nothing pending (no-op otherwise; false when nothing happened):
-- marks it done and appends, in order, the on_success (all succeeded, no cancellation request)
-- or on_failure callback and the on_complete callback to `ready` as ordinary job envelopes
-- (no _respire.batch field: callbacks never count), and the batch-completed event to `events`.
local function respire_batch_finish(s, ready, events)
  if not s.sealed or s.done or s.pending > 0 then return false end
  s.done = true
  local succeeded = s.failed == 0 and s.cancelled == 0 and not s.cancel
  s.outcome = succeeded and 'succeeded' or 'failed'
  local first = s.on_failure
  if succeeded then first = s.on_success end
  if first then
    ready[#ready + 1] = {'_respire.job.id', first[1], '_respire.job.payload', first[2]}
  end
  if s.on_complete then
    ready[#ready + 1] = {'_respire.job.id', s.on_complete[1], '_respire.job.payload',
                         s.on_complete[2]}
  end
  events[#events + 1] = {'kind', 'batch-completed', 'batch', s.id, 'outcome', s.outcome}
  return true
end

-- The coordination plan of a batch member's terminal outcome ('completed' | 'failed' |
-- 'cancelled'), see lib/coordination.lua: `c.key` the state key, `c.id` the batch id, `c.job_id`
-- the member's job id. Returns nil, nil when there is nothing to coordinate (the batch was
-- removed, or the job is not a pending member: a dead-letter replay running as an independent
-- job, or a repeated completion); nil, error reply before any write; or the plan. After a
-- cancellation request every outcome counts as cancelled. The plan of the last pending member
-- of a sealed batch also publishes the callbacks and the batch-completed event.
local function respire_batch_plan(c, outcome)
  local code = RESPIRE_BATCH.codes[outcome]
  if not code then
    return nil, redis.error_reply('RESPIRE_ARGUMENT unknown batch outcome ' .. tostring(outcome))
  end
  local raw, s, err = respire_batch_load(c.key, c.id)
  if err then return nil, err end
  if not s or s.m[c.job_id] ~= 0 then return nil, nil end
  if s.cancel then code = 3 end
  s.m[c.job_id] = code
  s.pending = s.pending - 1
  if code == 1 then
    s.succeeded = s.succeeded + 1
  elseif code == 2 then
    s.failed = s.failed + 1
  else
    s.cancelled = s.cancelled + 1
  end
  -- as_cancelled: the member's own event (and metrics, dead letter) must say cancelled too
  local plan = {key = c.key, old = raw, ready = {}, events = {}, as_cancelled = code == 3}
  respire_batch_finish(s, plan.ready, plan.events)
  plan.new = respire_batch_encode(s)
  return plan, nil
end

-- The status reply of batch_status: {pending, succeeded, failed, cancelled, sealed, cancel,
-- done, members} (flags as 0 | 1).
local function respire_batch_status(s)
  return {s.pending, s.succeeded, s.failed, s.cancelled, s.sealed and 1 or 0,
          s.cancel and 1 or 0, s.done and 1 or 0, s.n}
end
