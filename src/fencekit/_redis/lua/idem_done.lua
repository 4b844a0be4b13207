-- Mark a unit of work done, only by the owner that began it, optionally
-- storing a JSON memo with the same expiry.
--
-- KEYS[1]  idempotency key  P:idem:{K}
-- KEYS[2]  result key       P:idem:{K}:result
-- ARGV[1]  owner id
-- ARGV[2]  new TTL in seconds, 0 to keep the remaining TTL
-- ARGV[3]  1 to store ARGV[4] as the memo, 0 to delete any memo
-- ARGV[4]  memo JSON (when ARGV[3] is 1)
--
-- Reply: 1 when marked done.
-- Error: "IDEMNOTOWNED ..." when the key is not pending for this owner
--        (expired, reclaimed by another owner, or done already).
if redis.call('GET', KEYS[1]) ~= 'pending:' .. ARGV[1] then
  return redis.error_reply('IDEMNOTOWNED idempotency key ' .. KEYS[1] .. ' is not pending for this owner')
end
local ttl_ms
if tonumber(ARGV[2]) > 0 then
  ttl_ms = tonumber(ARGV[2]) * 1000
else
  ttl_ms = redis.call('PTTL', KEYS[1])
end
if ttl_ms > 0 then
  redis.call('SET', KEYS[1], 'done', 'PX', ttl_ms)
else
  redis.call('SET', KEYS[1], 'done')
end
if ARGV[3] == '1' then
  if ttl_ms > 0 then
    redis.call('SET', KEYS[2], ARGV[4], 'PX', ttl_ms)
  else
    redis.call('SET', KEYS[2], ARGV[4])
  end
else
  redis.call('DEL', KEYS[2])
end
return 1
