-- batch_status: read a batch's counts and flags.
--
-- KEYS[1]  batch state
-- ARGV[1]  batch id
--
-- Returns nil for an unknown (or removed) batch, else {pending, succeeded, failed, cancelled,
-- sealed, cancellation requested, completed, members} (flags 0 | 1). Retried members stay
-- pending; completed means the callbacks were published.
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM, RESPIRE_SCHEMA, RESPIRE_CORRUPT.
--!include lib/preflight.lua
--!include lib/batch.lua

if #ARGV ~= 1 or ARGV[1] == '' then
  return redis.error_reply('RESPIRE_ARGUMENT batch_status takes a batch id')
end
local _, s, err = respire_batch_load(KEYS[1], ARGV[1])
if err then return err end
if not s then return nil end
return respire_batch_status(s)
