-- Batch coordination (placeholder until batches land): no batch is ever planned.
local function respire_batch_plan(c, outcome)
  return nil, redis.error_reply('RESPIRE_SCHEMA batches are not supported by this version')
end
