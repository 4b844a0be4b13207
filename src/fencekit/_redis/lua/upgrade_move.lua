-- Carry one piece of state of the published fencekit 0.1-0.6 (another
-- author's package; keys P:idem:K, P:idem:K:result, P:lock:R,
-- P:fence:seq:R, P:fence:max:R) to our layout, atomically, keeping the
-- remaining expiry and never overwriting newer state of ours. Run by
-- ``fencekit upgrade-keys`` (fencekit/upgrade/); safe to repeat.
--
-- ARGV[1]  kind: "idem" | "lock" | "counter"
-- ARGV[2]  "1" to delete the old key(s) once carried (or ours is newer), else "0"
-- ARGV[3]  "1" for a dry run: decide and reply, write nothing
--
-- kind "idem"     (a marker and its memo move together)
--   KEYS[1] old marker  "pending:<owner>" | "done"   KEYS[2] old memo (JSON)
--   KEYS[3] our marker  P:idem:{K}                   KEYS[4] our memo P:idem:{K}:result
--   ours is written when absent, or when ours is pending and the old one done
--   (done wins); a done marker takes its memo along (or clears ours).
-- kind "lock"
--   KEYS[1] old lock (value: owner id, PX lease)     KEYS[2] old counter P:fence:seq:R
--   KEYS[3] our lock P:lock:{R}, written "<token>:<owner>" with the remaining
--   lease (token: the old counter, which the holder's grant got), only when
--   absent (an existing lock of ours is kept).
-- kind "counter"  (a token counter or a fence: the larger value wins)
--   KEYS[1] old P:fence:seq:R or P:fence:max:R       KEYS[2] our P:lock:{R}:seq or P:fence:{R}
--   the expiry becomes none when either had none, else the longer one.
--
-- Reply: "migrated"  ours now holds the old state (or would, in a dry run)
--        "current"   ours already holds exactly that state (an earlier run)
--        "kept"      ours holds newer state and stays as it is
--        "gone"      the old key no longer exists (expired since the SCAN)
--        "foreign"   the old value is not of the old layout; nothing is done
local kind, delete, dry = ARGV[1], ARGV[2] == '1', ARGV[3] == '1'

local function is_marker(v)
  return v == 'done' or string.sub(v, 1, 8) == 'pending:'
end

local function put(key, value, pttl)
  if pttl > 0 then
    redis.call('SET', key, value, 'PX', pttl)
  else
    redis.call('SET', key, value)
  end
end

local function finish(reply, ...)
  if delete and not dry and reply ~= 'foreign' then
    redis.call('DEL', ...)
  end
  return reply
end

if kind == 'idem' then
  local old = redis.call('GET', KEYS[1])
  if not old then return 'gone' end
  if not is_marker(old) then return 'foreign' end
  local ours = redis.call('GET', KEYS[3])
  if ours then
    if ours == old then return finish('current', KEYS[1], KEYS[2]) end
    if not (old == 'done' and string.sub(ours, 1, 8) == 'pending:') then
      return finish('kept', KEYS[1], KEYS[2])
    end
  end
  if not dry then
    put(KEYS[3], old, redis.call('PTTL', KEYS[1]))
    local memo = redis.call('GET', KEYS[2])
    if old == 'done' and memo then
      put(KEYS[4], memo, redis.call('PTTL', KEYS[2]))
    else
      redis.call('DEL', KEYS[4])
    end
  end
  return finish('migrated', KEYS[1], KEYS[2])
end

if kind == 'lock' then
  local owner = redis.call('GET', KEYS[1])
  if not owner then return 'gone' end
  local token = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
  if token < 1 then token = 1 end
  local value = string.format('%d', token) .. ':' .. owner
  local ours = redis.call('GET', KEYS[3])
  if ours then
    if ours == value then return finish('current', KEYS[1]) end
    return finish('kept', KEYS[1])
  end
  if not dry then
    put(KEYS[3], value, redis.call('PTTL', KEYS[1]))
  end
  return finish('migrated', KEYS[1])
end

if kind == 'counter' then
  local old = redis.call('GET', KEYS[1])
  if not old then return 'gone' end
  local n = tonumber(old)
  if not n then return 'foreign' end
  local ours = redis.call('GET', KEYS[2])
  local pttl = redis.call('PTTL', KEYS[1])
  if ours then
    local m = tonumber(ours)
    if not m then return 'foreign' end
    if m == n then return finish('current', KEYS[1]) end
    if m > n then return finish('kept', KEYS[1]) end
    local our_pttl = redis.call('PTTL', KEYS[2])
    if pttl < 0 or our_pttl < 0 then
      pttl = -1
    elseif our_pttl > pttl then
      pttl = our_pttl
    end
  end
  if not dry then
    put(KEYS[2], old, pttl)
  end
  return finish('migrated', KEYS[1])
end

error('upgrade_move.lua: unknown kind ' .. tostring(kind))  -- a bug of the builder, not input
