-- Include-only helper: leave one "work may be waiting" marker for idle
-- consumers blocked in BLPOP on the wake key (at most one marker at a time).
local function wake(key)
  if redis.call('LLEN', key) == 0 then
    redis.call('LPUSH', key, '1')
  end
end
