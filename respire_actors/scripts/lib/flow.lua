-- Flow coordination (placeholder until flows land): no flow is ever planned.
local function respire_flow_plan(c, outcome, result)
  return nil, redis.error_reply('RESPIRE_SCHEMA flows are not supported by this version')
end
