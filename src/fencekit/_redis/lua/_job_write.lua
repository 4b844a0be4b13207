-- Include-only helper: a running job's fenced SET (current_job().set_if_fresh).
-- The target is SET only while the delivery is still the task's current one --
-- still in its consumer's in-flight hash (not acknowledged, retried, failed,
-- reaped or returned) and not older than the job's fence, which exists only
-- once a delivery of the task was reaped or returned. Nothing is written for
-- the fence itself, so fenced jobs leave no key behind.
-- Returns nil when written, else the FENCED message (and nothing changed).
local function fenced_job_write(inflight, fence, target, token, value)
  if redis.call('HEXISTS', inflight, token) == 0 then
    return 'FENCED delivery ' .. token .. ' is no longer in flight'
  end
  local floor = tonumber(redis.call('GET', fence) or '0')
  if tonumber(token) < floor then
    return 'FENCED delivery ' .. token .. ' is older than ' .. string.format('%d', floor)
  end
  redis.call('SET', target, value)
  return nil
end
