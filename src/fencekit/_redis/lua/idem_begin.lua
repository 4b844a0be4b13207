-- Begin a unit of work at most once within the TTL (SET NX), and drop a
-- memo left behind by an earlier, expired "done".
--
-- KEYS[1]  idempotency key  P:idem:{K}         "pending:<owner>" | "done"
-- KEYS[2]  result key       P:idem:{K}:result  JSON memo
-- ARGV[1]  owner id
-- ARGV[2]  TTL in seconds (>= 1)
--
-- Reply: 1 when this caller begins, 0 when the key exists (pending or done).
if redis.call('SET', KEYS[1], 'pending:' .. ARGV[1], 'NX', 'EX', ARGV[2]) then
  redis.call('DEL', KEYS[2])
  return 1
end
return 0
