-- job_trim: plan or apply the retention of one job queue stream (ready, events or dead letters)
-- without removing an entry that is pending or not yet delivered to every consumer group.
--
-- KEYS[1]  the stream (ready stream, event stream or dead-letter stream; never :scheduled)
-- ARGV[1]  mode: 'plan' (read only), 'trim' (apply a plan made earlier) or 'apply' (plan and
--          trim in this one call)
-- ARGV[2]  max age in milliseconds (1 .. 2^53-1), or '' for none
-- ARGV[3]  max length (0 .. 2^53-1), or '' for none (at least one of the two is required)
-- ARGV[4]  limit: the most entries one call removes (1 .. 100000)
-- ARGV[5]  'trim' only: the plan's cutoff id
-- ARGV[6]  'trim' only: n, the number of consumer groups the plan saw
-- ARGV[7..] 'trim' only: their names
--
-- An entry is out of policy when it is older than the max age (its id's time below server time
-- minus the age) or not among the newest max-length entries. The cutoff is the id of the oldest
-- entry that stays: the first one, scanning from the oldest, that is in policy, or is at or
-- after a group boundary (each group's lowest pending id and first existing undelivered entry,
-- lib/retention.lua; a ready stream with no consumer group at all has its first entry as the
-- boundary: nothing goes), or is past the limit. XTRIM MINID with that exact cutoff removes only the
-- entries scanned before it. 'trim' recomputes the plan first and refuses (returns 'changed')
-- when the set of groups differs from the plan's or when the recomputed cutoff comes before the
-- plan's (a group was created or moved back, or entries were deleted meanwhile); otherwise it
-- removes exactly the entries below the plan's cutoff. After a trim every protected boundary
-- is verified to still exist.
-- Returns for 'plan': {length, cutoff ('' when nothing goes), entries that would go, 1 when the
--          limit stopped the scan else 0, policy age cutoff ('' for none), group boundary (''
--          for none), n groups, then 5 values per group: name, last-delivered-id, pending
--          count, lowest pending id (''), first undelivered id ('')};
--         for 'trim' and 'apply': {'trimmed', entries removed, cutoff ('' when nothing went)}
--          or {'changed', why} (nothing removed).
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM before any write;
-- RESPIRE_TRIM_VERIFY if a protected entry is missing afterwards (never expected).
--!include lib/preflight.lua
--!include lib/fence.lua
--!include lib/stream_id.lua
--!include lib/retention.lua

local stream, mode = KEYS[1], ARGV[1]
local function int_arg(value, lo, hi)
  if value == nil or not string.match(value, '^%d+$') then return nil end
  local n = tonumber(value)
  if n < lo or n > hi then return nil end
  return n
end
local max_age = ARGV[2] ~= '' and int_arg(ARGV[2], 1, 9007199254740991) or nil
local max_len = ARGV[3] ~= '' and int_arg(ARGV[3], 0, 9007199254740991) or nil
local limit = int_arg(ARGV[4], 1, 100000)
if (mode ~= 'plan' and mode ~= 'trim' and mode ~= 'apply') or (ARGV[2] ~= '' and not max_age)
   or (ARGV[3] ~= '' and not max_len) or (not max_age and not max_len) or not limit then
  return redis.error_reply('RESPIRE_ARGUMENT job_trim needs a mode, a max age or length, a limit')
end
local planned, expected = nil, nil
if mode == 'trim' then
  local n = int_arg(ARGV[6], 0, 100000)
  planned = ARGV[5]
  if not planned or not respire_id_parse(planned) or not n or #ARGV ~= 6 + n then
    return redis.error_reply('RESPIRE_ARGUMENT job_trim trim needs the plan cutoff and groups')
  end
  expected = {}
  for i = 7, 6 + n do expected[#expected + 1] = ARGV[i] end
elseif #ARGV ~= 4 then
  return redis.error_reply('RESPIRE_ARGUMENT job_trim plan/apply takes 4 arguments')
end
local perms = {{'XINFO', 'GROUPS', stream}, {'XPENDING', stream, 'g', '-', '+', '1'},
               {'XRANGE', stream, '-', '+', 'COUNT', '1'}}
if mode ~= 'plan' then perms[#perms + 1] = {'XTRIM', stream, 'MINID', '0-1'} end
local err = respire_preflight({{stream, 'stream'}}, perms)
if err then return err end

local length = redis.call('XLEN', stream)
local groups, boundary, protected = {}, nil, {}
if length > 0 then groups, boundary, protected = respire_trim_inventory(stream) end
if length > 0 and #groups == 0 and string.sub(stream, -6) == ':ready' then
  -- a ready stream no worker has read yet (or whose group vanished): every entry is a job still
  -- to be processed, and the first worker's group starts at the beginning. Nothing may go.
  boundary = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)[1][1]
  protected = {boundary}
end
local age_cut = nil
if max_age then age_cut = string.format('%d-0', math.max(respire_now_ms() - max_age, 0)) end
local beyond = 0
if max_len then beyond = math.max(length - max_len, 0) end

-- the scan: entries go, oldest first, while out of policy, below every boundary, within limit
local count, cutoff, limited, last, cursor = 0, nil, 0, nil, '-'
while cutoff == nil and length > 0 do
  local rows = redis.call('XRANGE', stream, cursor, '+', 'COUNT', 256)
  if #rows == 0 then break end
  for _, row in ipairs(rows) do
    local id = row[1]
    local out = count < beyond or (age_cut ~= nil and respire_id_lt(id, age_cut))
    if not out or (boundary and not respire_id_lt(id, boundary)) then
      cutoff = id
      break
    end
    if count >= limit then
      cutoff, limited = id, 1
      break
    end
    count, last = count + 1, id
  end
  if last then cursor = '(' .. last end
end
if cutoff == nil and count > 0 then cutoff = respire_id_next(last) end

if mode == 'plan' then
  local shown = ''
  if count > 0 then shown = cutoff end
  local out = {length, shown, count, limited, age_cut or '', boundary or '', #groups}
  for _, g in ipairs(groups) do
    for _, v in ipairs({g.name, g.last, g.pending, g.lowest or '', g.nxt or ''}) do
      out[#out + 1] = v
    end
  end
  return out
end
if mode == 'trim' then
  local names = {}
  for _, g in ipairs(groups) do names[#names + 1] = g.name end
  table.sort(names)
  table.sort(expected)
  if table.concat(names, '\0') ~= table.concat(expected, '\0') then
    return {'changed', 'the consumer groups changed since the plan'}
  end
  if cutoff == nil or respire_id_lt(cutoff, planned) then
    return {'changed', 'group positions or entries changed since the plan'}
  end
  cutoff = planned
end
if cutoff == nil or count == 0 then return {'trimmed', 0, ''} end
local removed = redis.call('XTRIM', stream, 'MINID', cutoff)
local verr = respire_trim_verify(stream, protected)
if verr then return verr end
return {'trimmed', removed, cutoff}
