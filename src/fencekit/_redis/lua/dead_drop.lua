-- Drop one dead letter (its payload, its reason and its place in the index):
-- the admin page's bulk delete of dead tasks. A record the task keeps stays.
--
-- KEYS[1]  dead        P:{Q}:dead         HASH id -> raw, "<id>:why" -> JSON
-- KEYS[2]  dead index  P:{Q}:dead:index   ZSET id -> ms
-- ARGV[1]  the dead letter's id
--
-- Reply: 1 when it was there, else 0.
redis.call('HDEL', KEYS[1], ARGV[1], ARGV[1] .. ':why')
return redis.call('ZREM', KEYS[2], ARGV[1])
