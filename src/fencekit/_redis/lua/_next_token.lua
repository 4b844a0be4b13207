-- Include-only helper: issue fencing tokens from a counter key.
--
-- next_tokens(counter, n) reserves n consecutive tokens and returns the
-- first: first = max(last + 1, server time in microseconds), and the counter
-- then holds first + n - 1. The time term keeps tokens growing even when a
-- failover loses the last writes of the counter, provided the clocks of the
-- Redis nodes agree within the failover time. Tokens stay below 2^53, so
-- Lua's doubles hold them exactly. Needs _clock.lua (the script's one TIME).
local function next_tokens(counter, n)
  local now_us = clock_us()
  local first = tonumber(redis.call('GET', counter) or '0') + 1
  if now_us > first then first = now_us end
  redis.call('SET', counter, string.format('%d', first + n - 1))
  return first
end
