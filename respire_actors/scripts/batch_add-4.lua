-- batch_add: add one member to an open batch and enqueue it on the ready stream, atomically.
--
-- KEYS[1]  batch state
-- KEYS[2]  ready stream
-- KEYS[3]  control hash (its max_backlog field is the optional backlog bound)
-- KEYS[4]  staging stream (:scheduled; counted in the backlog)
-- ARGV[1]  batch id
-- ARGV[2]  member job id
-- ARGV[3]  serialized payload
-- ARGV[4..] further envelope field/value pairs (trace context), appended as given
--
-- Member ids are unique within the batch (independently of ordinary enqueue deduplication):
-- an existing member keeps its payload and entry, also after sealing. A new member is appended
-- as {_respire.job.id, job id, _respire.job.payload, payload, _respire.batch, batch id, ...}
-- and counted pending; the state and the entry are written together.
-- Returns {'added', entry id}, {'exists', ''}, {'unknown', ''} (no such batch), {'sealed', ''}
-- (a new id for a sealed batch), {'members', ''} (the batch has 256 members) or {'bytes', ''}
-- (the 256 KiB of ids and payloads would be exceeded); nothing is written but for 'added'.
-- Errors: RESPIRE_FULL (the backlog bound is reached, see lib/backlog.lua), RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM, RESPIRE_SCHEMA, RESPIRE_CORRUPT
-- before any write; should the state write fail after the append, the entry is deleted again
-- and RESPIRE_BATCH is returned.
--!include lib/preflight.lua
--!include lib/backlog.lua
--!include lib/batch.lua

local state, ready, control, scheduled = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, job, payload = ARGV[1], ARGV[2], ARGV[3]
if #ARGV < 3 or #ARGV % 2 ~= 1 or id == '' or job == '' then
  return redis.error_reply('RESPIRE_ARGUMENT batch_add takes a batch id, a job id, a payload '
                           .. 'and field/value pairs')
end
local _, s, err = respire_batch_load(state, id)
if err then return err end
if not s then return {'unknown', ''} end
if s.m[job] then return {'exists', ''} end
if s.sealed then return {'sealed', ''} end
local full = respire_batch_room(s, 1, #job + #payload)
if full then return {full, ''} end
err = respire_backlog_refusal(control, ready, scheduled, 1)
if err then return err end
err = respire_preflight({{ready, 'stream'}},
                        {{'XADD', ready, '*', 'f', 'v'}, {'XDEL', ready, '0-1'},
                         {'SET', state, 'v'}})
if err then return err end

s.m[job] = 0
s.n = s.n + 1
s.pending = s.pending + 1
s.bytes = s.bytes + #job + #payload
local entry = redis.call('XADD', ready, '*', '_respire.job.id', job, '_respire.job.payload',
                         payload, '_respire.batch', id, unpack(ARGV, 4))
local ok, setErr = pcall(redis.call, 'SET', state, respire_batch_encode(s))
if not ok then
  redis.call('XDEL', ready, entry)
  return redis.error_reply('RESPIRE_BATCH recording the member failed: ' .. tostring(setErr))
end
return {'added', entry}
