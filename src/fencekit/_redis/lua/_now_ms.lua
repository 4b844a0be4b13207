-- Include-only helper: the Redis server's clock in milliseconds. Every queue
-- timestamp comes from here, so the clocks of the hosts running consumers
-- never have to agree.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
