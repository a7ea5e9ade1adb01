-- Shared helpers of the reliable queue and topic scripts (rq_*, topic_*); include
-- lib/stream_id.lua before it.
--
-- Delivery metadata of one endpoint (a queue, or one topic subscription):
--   deadlines  sorted set: member = stream entry id, score = server time (ms) at which the
--              current lease expires, or at which a NACKed entry becomes due again
--   receipts   hash: field = stream entry id, value = '<count>:<stamp>' while leased, or
--              '<count>:-' once NACKed (the receipt is revoked); <count> is the number of
--              deliveries so far and <stamp> the server time (us) of the current delivery
-- A receipt '<id>:<count>:<stamp>' is valid while receipts[id] equals '<count>:<stamp>' and
-- deadlines[id] is later than the server's clock.

-- The server clock: milliseconds, and a microsecond stamp that fences one delivery.
local function rq_now()
  local t = redis.call('TIME')
  local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  return ms, t[1] .. string.format('%06d', tonumber(t[2]))
end

-- An integer argument within [lo, hi], or nil.
local function rq_int(value, lo, hi)
  if value == nil or not string.match(value, '^%d+$') then return nil end
  local n = tonumber(value)
  if n < lo or n > hi then return nil end
  return n
end

-- The delivery count stored in a receipts value ('<count>:<stamp>' or '<count>:-').
local function rq_count(meta)
  if not meta then return 1 end
  return tonumber(string.match(meta, '^(%d+):')) or 1
end

-- The value of field `name` in a flat stream-entry field list (false if absent).
local function rq_field(fields, name)
  for i = 1, #fields, 2 do
    if fields[i] == name then return fields[i + 1] end
  end
  return false
end

-- Whether XACKDEL (Redis 8.2+) exists on this server and the ACL user may run it. Decided on
-- the serving server at every call, so a failover to another version is never mis-handled.
-- acl_check_cmd raises for an unknown command; pcall turns that into "not available".
local function rq_xackdel_usable(stream, group)
  local ok, allowed = pcall(redis.acl_check_cmd, 'XACKDEL', stream, group, 'IDS', '1', '0-1')
  return ok and allowed == true
end

-- Permission probes for completing an entry: XACKDEL when usable, else XACK plus XDEL
-- (queues), or XACK alone (topics, whose entries other subscriptions still need).
local function rq_completion_probes(stream, group, delete, xackdel)
  if not delete then return {{'XACK', stream, group, '0-1'}} end
  if xackdel then return {} end
  return {{'XACK', stream, group, '0-1'}, {'XDEL', stream, '0-1'}}
end

-- Completes an entry for this endpoint's group: acknowledges it and, for a queue, deletes it.
local function rq_finish(stream, group, id, delete, xackdel)
  if not delete then
    redis.call('XACK', stream, group, id)
  elseif xackdel then
    redis.call('XACKDEL', stream, group, 'IDS', 1, id)
  else
    redis.call('XACK', stream, group, id)
    redis.call('XDEL', stream, id)
  end
end

-- Parses the endpoint mode argument: 'queue' deletes completed entries and creates its private
-- group on demand; 'topic' only acknowledges and requires the subscription's group to exist.
local function rq_mode(value)
  if value == 'queue' then return true end
  if value == 'topic' then return false end
  return nil
end
