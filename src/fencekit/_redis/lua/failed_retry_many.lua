-- Run a batch of kept failures again (retry-all): each as failed_retry.lua
-- does it, the counters bumped once for the batch. A record no longer in the
-- failed index (retried or trimmed meanwhile) is skipped, and so is one whose
-- state is no longer "failed" (its jid was enqueued again: that task lives on
-- its own), its stale index entry dropped. The records arrive oldest first and
-- the index holds the newest at its head, so LREM from the tail (count -1)
-- finds each one at once.
--
-- KEYS[1]  failed      P:{Q}:failed       LIST record keys, newest first
-- KEYS[2]  pending     P:{Q}:pending
-- KEYS[3]  stats       P:{Q}:stats        ("enqueued" and "revived" += the count)
-- KEYS[4]  wake        P:{Q}:wake
-- KEYS[5..] records    P:{Q}:job:<jid>    one per pair of ARGV, in order
-- ARGV     pairs: the envelope to enqueue (attempt 0), the retention of the new
--          attempt's record in ms (0: no record)
--
-- Reply: how many tasks were enqueued.
--!include _wake.lua
--!include _prio.lua
--!include _now_ms.lua
--!include _env.lua
local n = 0
local now = nil
for i = 5, #KEYS do
  local record = KEYS[i]
  if redis.call('LREM', KEYS[1], -1, record) > 0 and redis.call('HGET', record, 'state') == 'failed' then
    local envelope = ARGV[2 * (i - 4) - 1]
    local keep = ARGV[2 * (i - 4)]
    push_pending(KEYS[2], envelope, false)
    redis.call('DEL', record)
    if keep ~= '0' then
      now = now or now_ms()
      write_env(record, envelope, { 'state', 'pending', 'enqueued', now, 'keep', keep })
    end
    n = n + 1
  end
end
if n > 0 then
  redis.call('HINCRBY', KEYS[3], 'enqueued', n)
  redis.call('HINCRBY', KEYS[3], 'revived', n)
  wake(KEYS[4])
end
return n
