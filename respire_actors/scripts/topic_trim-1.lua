-- topic_trim: apply a retention policy to a topic stream without removing any publication a
-- subscription still needs (the conservative MINID procedure, run atomically).
--
-- KEYS[1]  topic publication stream
-- ARGV[1]  max age in milliseconds, or '' (entries older than now - age are out of policy)
-- ARGV[2]  max length, or '' (entries beyond the newest N are out of policy)
-- ARGV[3]  minimum id to keep, or '' (entries below it are out of policy)
--
-- The policy cutoff is the highest of the given limits (an entry outside any of them may go).
-- For every consumer group (XINFO GROUPS) two boundaries are protected: its lowest pending id
-- (extended XPENDING; covers leased and NACKed messages) and its first existing undelivered
-- entry (XRANGE (last-delivered-id + COUNT 1). The exact MINID cutoff is the earliest of the
-- policy cutoff and all boundaries. Because the whole procedure is one script, subscriptions
-- cannot be created, removed or repositioned between the inventory and the trim. Afterwards
-- every protected boundary is verified to still exist.
-- A length limit costs at most the smaller of the entries out of it and max_len (see below).
-- Returns {entries removed, exact MINID cutoff used, policy cutoff, names of the
--          subscriptions that held the cutoff below the policy...}; {0, '', ''} when the stream
--          does not exist or no entry is out of policy.
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM before any write;
-- RESPIRE_TRIM_VERIFY if a protected entry is missing afterwards (never expected).
--!include lib/preflight.lua
--!include lib/stream_id.lua
--!include lib/rq_common.lua
--!include lib/retention.lua

local stream = KEYS[1]
local max_age = ARGV[1] ~= '' and rq_int(ARGV[1], 0, 9007199254740991) or nil
local max_len = ARGV[2] ~= '' and rq_int(ARGV[2], 0, 9007199254740991) or nil
local min_id = ARGV[3] ~= '' and ARGV[3] or nil
if (ARGV[1] ~= '' and not max_age) or (ARGV[2] ~= '' and not max_len)
    or (min_id and not respire_id_parse(min_id)) or (not max_age and not max_len and not min_id) then
  return redis.error_reply('RESPIRE_ARGUMENT topic_trim needs a valid max age, max length or min id')
end
local err = respire_preflight({{stream, 'stream'}},
  {{'XINFO', 'GROUPS', stream}, {'XPENDING', stream, 'g', '-', '+', '1'},
   {'XRANGE', stream, '-', '+', 'COUNT', '1'}, {'XREVRANGE', stream, '+', '-', 'COUNT', '1'},
   {'XTRIM', stream, 'MINID', '0-1'}, {'XLEN', stream}})
if err then return err end
if redis.call('EXISTS', stream) == 0 then
  return {0, '', ''}
end

local function later(a, b)
  if a == nil then return b end
  if b == nil then return a end
  if respire_id_lt(a, b) then return b end
  return a
end

-- the policy cutoff: entries with lower ids are out of retention
local policy = min_id
if max_age then
  local now = rq_now()
  policy = later(policy, math.max(now - max_age, 0) .. '-0')
end
-- inventory of every group's boundaries (lib/retention.lua)
local groups, boundary, protected = respire_trim_inventory(stream)

if max_len then
  -- The length cutoff is the first entry after the oldest (XLEN - max_len). It is found from
  -- whichever end is nearer, so a call costs at most the smaller of the entries out of policy
  -- and max_len (nothing when the stream is within its length). From the oldest end the walk
  -- goes a page at a time and stops early once past every subscription's protected ids: the
  -- cut is then theirs whatever the exact length cutoff, and the policy cutoff reported is the
  -- id reached (a lower bound).
  local excess = redis.call('XLEN', stream) - max_len
  if excess > 0 and max_len <= excess then
    local newest = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', max_len + 1)
    if max_len == 0 then
      policy = later(policy, respire_id_next(newest[1][1]))
    else
      policy = later(policy, newest[max_len][1])
    end
  elseif excess > 0 then
    local top = nil
    for _, g in ipairs(groups) do
      for _, id in ipairs({g.lowest, g.nxt}) do
        if id and (top == nil or respire_id_lt(top, id)) then top = id end
      end
    end
    local start, skipped, found = '-', 0, nil
    while not found do
      local want = math.min(excess - skipped + 1, 1000)
      local page = redis.call('XRANGE', stream, start, '+', 'COUNT', want)
      if #page == 0 then break end
      if skipped + #page > excess then
        found = page[excess - skipped + 1][1]
      else
        skipped = skipped + #page
        local last = page[#page][1]
        if top and respire_id_lt(top, last) then found = last; break end
        start = '(' .. last
      end
    end
    if found then policy = later(policy, found) end
  end
end
if policy == nil then
  return {0, '', ''}
end
local cutoff = policy
if boundary and respire_id_lt(boundary, cutoff) then cutoff = boundary end
local held_by = {}
for _, g in ipairs(groups) do
  for _, id in ipairs({g.lowest, g.nxt}) do
    if id and respire_id_lt(id, policy) then
      held_by[#held_by + 1] = g.name
      break
    end
  end
end

local removed = redis.call('XTRIM', stream, 'MINID', cutoff)

local verr = respire_trim_verify(stream, protected)
if verr then return verr end
local out = {removed, cutoff, policy}
for _, name in ipairs(held_by) do out[#out + 1] = name end
return out
