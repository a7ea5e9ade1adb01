-- batch_check: whether cancellation of a batch was requested (the worker asks before running a
-- member's handler, and acknowledges the member as cancelled when it was).
--
-- KEYS[1]  batch state
-- ARGV[1]  batch id
-- ARGV[2]  optional: the member's job id; when given, 1 only while that job is a pending member
--          (a dead-letter replay of a finished member runs as an independent job)
--
-- Returns 1 when cancellation was requested, else 0 (also 0 when the state is absent).
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM, RESPIRE_SCHEMA (unknown schema
-- version), RESPIRE_CORRUPT.
--!include lib/preflight.lua
--!include lib/batch.lua

if (#ARGV ~= 1 and #ARGV ~= 2) or ARGV[1] == '' then
  return redis.error_reply('RESPIRE_ARGUMENT batch_check takes a batch id and a job id')
end
local _, s, err = respire_batch_load(KEYS[1], ARGV[1])
if err then return err end
if not s or not s.cancel then return 0 end
if ARGV[2] and s.m[ARGV[2]] ~= 0 then return 0 end
return 1
