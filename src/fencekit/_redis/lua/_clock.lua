-- Include-only helper: the script's one reading of the Redis clock.
--
-- clock_us() calls TIME the first time and returns that same value, in
-- microseconds, for the rest of the script: a claim's rate buckets (_flow.lua)
-- and its delivery tokens (_next_token.lua) then describe one instant. Two
-- readings differ by whatever the script did between them, or by the time
-- Redis was descheduled on a loaded host; a bucket refilled at one and its
-- claims stamped at the other made their tests see a claim a few ms early.
-- Include it once, at the top level of the script, before its users.
local script_clock_us = nil
local function clock_us()
  if not script_clock_us then
    local t = redis.call('TIME')
    script_clock_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return script_clock_us
end
