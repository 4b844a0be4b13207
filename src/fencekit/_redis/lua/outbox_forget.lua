-- Forget the markers of relayed tasks whose outbox rows' delete committed
-- (fencekit.services.relay): no row is left to push them again. All in one
-- queue's slot.
--
-- KEYS[1..]  markers   P:{Q}:relayed:<jid>
--
-- Reply: the number of markers removed.
return redis.call('UNLINK', unpack(KEYS))
