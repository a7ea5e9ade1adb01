-- rq_receive: lease up to N messages of a reliable queue or topic subscription, doing bounded
-- recovery and dead-letter work first.
--
-- KEYS[1]  stream (queue ready stream, or topic publication stream)
-- KEYS[2]  deadlines sorted set of this endpoint (member entry id, score deadline ms)
-- KEYS[3]  receipts hash of this endpoint (entry id -> '<count>:<stamp>' or '<count>:-')
-- KEYS[4]  dead-letter stream of this endpoint
-- ARGV[1]  consumer group (the queue's private group, or the subscription name)
-- ARGV[2]  consumer name
-- ARGV[3]  max messages to return (1 .. 1000)
-- ARGV[4]  visibility timeout in milliseconds (1 .. 2^31-1)
-- ARGV[5]  delivery limit (1 .. 2^31-1)
-- ARGV[6]  mode: 'queue' or 'topic' (see rq_mode in lib/rq_common.lua)
--
-- 1. Due entries first (expired leases and due NACKs, earliest deadline first, at most 2*max
--    examined): an entry already delivered `limit` times moves atomically to KEYS[4] (fields
--    payload, source_id, delivery_count) and is acknowledged (and, for a queue, deleted);
--    otherwise it is redelivered with count + 1, until max messages are leased. An entry whose
--    payload is gone (trimmed or deleted from outside) has its metadata dropped and is counted.
-- 2. The rest of the batch comes from never-delivered entries (XREADGROUP >), with count 1.
--    A queue creates its private group at id 0 on first use, and again if someone deleted it:
--    acknowledged messages are deleted entries, so they cannot come back; an entry that still
--    has a receipt (leased, or NACKed and not yet due) is skipped, its deadline decides.
-- Every leased entry gets deadline now + visibility on the server's clock and a fresh stamp.
-- Returns {now ms, number moved to dead letters, number of due entries whose payload was gone,
-- then per message: id, payload, count, stamp,
-- traceparent, tracestate} (the last two from _respire.trace.parent / _respire.trace.state,
-- '' when the entry has none).
-- Errors, all before any write: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM,
-- RESPIRE_NOSUBSCRIPTION (topic mode: the subscription's group does not exist).
--!include lib/preflight.lua
--!include lib/stream_id.lua
--!include lib/rq_common.lua

local stream, deadlines, receipts, dead = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, consumer = ARGV[1], ARGV[2]
local max = rq_int(ARGV[3], 1, 1000)
local visibility = rq_int(ARGV[4], 1, 2147483647)
local limit = rq_int(ARGV[5], 1, 2147483647)
local delete = rq_mode(ARGV[6])
if not max or not visibility or not limit or delete == nil or not consumer or group == '' then
  return redis.error_reply('RESPIRE_ARGUMENT rq_receive arguments are malformed')
end

local xackdel = delete and rq_xackdel_usable(stream, group)
local perms = {
  {'XREADGROUP', 'GROUP', group, consumer, 'COUNT', '1', 'STREAMS', stream, '>'},
  {'XINFO', 'CONSUMERS', stream, group}, {'XRANGE', stream, '0-1', '0-1'},
  {'ZRANGEBYSCORE', deadlines, '0', '1'}, {'ZADD', deadlines, '1', 'm'}, {'ZREM', deadlines, 'm'},
  {'HGET', receipts, 'f'}, {'HSET', receipts, 'f', 'v'}, {'HDEL', receipts, 'f'},
  {'XADD', dead, '*', 'f', 'v'}}
if delete then
  perms[#perms + 1] = {'XGROUP', 'CREATE', stream, group, '0'}
end
for _, probe in ipairs(rq_completion_probes(stream, group, delete, xackdel)) do
  perms[#perms + 1] = probe
end
local err = respire_preflight(
  {{stream, 'stream'}, {deadlines, 'zset'}, {receipts, 'hash'}, {dead, 'stream'}}, perms)
if err then return err end

local stream_exists = redis.call('EXISTS', stream) == 1
local group_exists = false
if stream_exists then
  local info = redis.pcall('XINFO', 'CONSUMERS', stream, group)
  group_exists = not (type(info) == 'table' and info.err)
end
if not delete and not group_exists then
  return redis.error_reply('RESPIRE_NOSUBSCRIPTION no subscription ' .. group .. ' on ' .. stream)
end

-- validated; writes from here on
local now, stamp = rq_now()
local deadline = now + visibility
local out = {now, 0, 0}
local leased, moved = 0, 0

-- due entries in deadline order, and in stream order among equal deadlines (a batch leased
-- together shares one deadline; the sorted set alone would order its ids as text: '5-10'
-- before '5-9')
local scored = redis.call('ZRANGEBYSCORE', deadlines, '-inf', now, 'WITHSCORES', 'LIMIT', 0,
  2 * max)
local due, keyed = {}, {}
for i = 1, #scored, 2 do
  local id = scored[i]
  due[#due + 1] = id
  keyed[id] = {tonumber(scored[i + 1]), respire_id_sortable(id)}
end
table.sort(due, function(a, b)
  local ka, kb = keyed[a], keyed[b]
  if ka[1] ~= kb[1] then return ka[1] < kb[1] end
  return ka[2] < kb[2]
end)
local lost = 0
for _, id in ipairs(due) do
  if leased >= max then break end
  local count = rq_count(redis.call('HGET', receipts, id))
  local entry = redis.call('XRANGE', stream, id, id)
  if #entry == 0 then
    lost = lost + 1
    redis.call('ZREM', deadlines, id)
    redis.call('HDEL', receipts, id)
    if group_exists then redis.call('XACK', stream, group, id) end
  elseif count >= limit then
    local payload = rq_field(entry[1][2], 'p') or ''
    redis.call('XADD', dead, '*', 'payload', payload, 'source_id', id, 'delivery_count', count)
    redis.call('ZREM', deadlines, id)
    redis.call('HDEL', receipts, id)
    if group_exists then
      rq_finish(stream, group, id, delete, xackdel)
    elseif delete then
      redis.call('XDEL', stream, id)  -- the group was destroyed externally: nothing to ack
    end
    moved = moved + 1
  else
    count = count + 1
    redis.call('HSET', receipts, id, count .. ':' .. stamp)
    redis.call('ZADD', deadlines, deadline, id)
    out[#out + 1] = id
    out[#out + 1] = rq_field(entry[1][2], 'p') or ''
    out[#out + 1] = count
    out[#out + 1] = stamp
    out[#out + 1] = rq_field(entry[1][2], '_respire.trace.parent') or ''
    out[#out + 1] = rq_field(entry[1][2], '_respire.trace.state') or ''
    leased = leased + 1
  end
end
out[2] = moved
out[3] = lost

if leased < max and stream_exists then
  if not group_exists then
    redis.call('XGROUP', 'CREATE', stream, group, '0')
  end
  local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', max - leased,
    'STREAMS', stream, '>')
  if reply then
    for _, entry in ipairs(reply[1][2]) do
      local id = entry[1]
      -- An entry that already has a receipt was handed out before: its group was deleted and
      -- recreated at 0 (XGROUP DESTROY by someone). Its lease or due NACK is still tracked in
      -- the deadlines set, which alone decides when it is delivered again; leasing it here would
      -- give a live lease to a second receiver.
      if not redis.call('HGET', receipts, id) then
        redis.call('HSET', receipts, id, '1:' .. stamp)
        redis.call('ZADD', deadlines, deadline, id)
        out[#out + 1] = id
        out[#out + 1] = rq_field(entry[2], 'p') or ''
        out[#out + 1] = 1
        out[#out + 1] = stamp
        out[#out + 1] = rq_field(entry[2], '_respire.trace.parent') or ''
        out[#out + 1] = rq_field(entry[2], '_respire.trace.state') or ''
      end
    end
  end
end
return out
