-- batch_create: create a batch's state with its callbacks, unless the id already exists.
--
-- KEYS[1]  batch state (<base>:batch:<sha1hex(batch id)>)
-- KEYS[2]  the queue's coordination marker (<base>:coordinated)
-- ARGV[1]  batch id
-- ARGV[2]  on_success job id ('' for none)
-- ARGV[3]  on_success payload (serialized; '' when there is no callback)
-- ARGV[4]  on_failure job id ('' for none)
-- ARGV[5]  on_failure payload
-- ARGV[6]  on_complete job id ('' for none)
-- ARGV[7]  on_complete payload
--
-- A new batch is open (unsealed), empty, and keeps its callbacks until it completes. The marker
-- (string "1", never deleted) tells the completion scripts that this queue has coordinated jobs.
-- Returns 'created', 'exists' (the batch exists: nothing changed, its first callbacks are kept)
-- or 'too-large' (the callbacks' ids and payloads exceed 256 KiB; nothing written).
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM, RESPIRE_SCHEMA (an existing state
-- of an unknown schema version), RESPIRE_CORRUPT, all before any write.
--!include lib/preflight.lua
--!include lib/batch.lua

local state, marker = KEYS[1], KEYS[2]
local id = ARGV[1]
if #ARGV ~= 7 or id == '' then
  return redis.error_reply('RESPIRE_ARGUMENT batch_create takes a batch id and three callbacks')
end
local callbacks = {}
for i = 0, 2 do
  local job, payload = ARGV[2 + i * 2], ARGV[3 + i * 2]
  if job == '' then
    if payload ~= '' then
      return redis.error_reply('RESPIRE_ARGUMENT a callback payload without a job id')
    end
    callbacks[i + 1] = false
  else
    callbacks[i + 1] = {job, payload}
  end
end
local raw, _, err = respire_batch_load(state, id)
if err then return err end
if raw then return 'exists' end
local s = respire_batch_new(id, callbacks[1], callbacks[2], callbacks[3])
if s.bytes > RESPIRE_BATCH.max_bytes then return 'too-large' end
err = respire_preflight({{marker, 'string'}},
                        {{'SET', state, 'v'}, {'EXISTS', marker}, {'SET', marker, '1'}})
if err then return err end
-- The marker first: it is only ever set, so a failure after it leaves nothing to undo.
if redis.call('EXISTS', marker) == 0 then redis.call('SET', marker, '1') end
redis.call('SET', state, respire_batch_encode(s))
return 'created'
