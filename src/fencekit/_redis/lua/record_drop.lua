-- Forget one kept record: it leaves its index and is deleted, and the unique
-- key it holds goes with it (a unique key dedupes no longer than its holder's
-- record lives). The admin page's bulk delete of finished or failed tasks.
--
-- KEYS[1]  index     P:{Q}:finished or P:{Q}:failed   LIST record keys, newest first
-- KEYS[2]  record    P:{Q}:job:<jid>
-- ARGV     none
--
-- Reply: 1 when the record existed, else 0 (its key is taken out of the index either way).
--!include _record.lua
redis.call('LREM', KEYS[1], 1, KEYS[2])
local unique = record_unique(KEYS[2], string.match(KEYS[1], '^(.*:)[^:]*$'))
if unique then
  redis.call('DEL', unique)
end
return redis.call('DEL', KEYS[2])
