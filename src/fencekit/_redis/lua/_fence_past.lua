-- Include-only helper: raise a job's fence above a delivery that is being
-- taken away (reaped, returned, failed), so that delivery's fenced writes are
-- refused from now on, even before the next delivery writes anything.
local function fence_past(fence_key, token, ttl_ms)
  if tonumber(token) == nil then
    return  -- not a delivery token (a corrupt in-flight field): nothing was fenced by it
  end
  local floor = tonumber(token) + 1
  if tonumber(redis.call('GET', fence_key) or '0') < floor then
    redis.call('SET', fence_key, string.format('%d', floor), 'PX', ttl_ms)
  end
end
