-- Include-only helpers of checkpoints (current_job().checkpoint: docs/guides/long-jobs.md).
--
-- A task that checkpointed has a state P:{Q}:state:<jid>, and its envelope ends
-- with the mark ,"ckpt":1} (the codec writes "ckpt" last), so every later
-- delivery of it reads the state before it runs. The mark is put on the
-- in-flight envelope by checkpoint.lua and carried by whoever queues the task
-- again from it (carry_mark: retry.lua, requeue.lua). drop_state: a task that
-- is final without succeeding (failed for good, dead, cancelled, expired,
-- purged) loses its state; one that succeeds keeps it with its record
-- (ack_claim.lua).
local CKPT_MARK = ',"ckpt":1}'

local function marked(envelope)
  return string.sub(envelope, -#CKPT_MARK) == CKPT_MARK
end

local function mark(envelope)
  if marked(envelope) then
    return envelope
  end
  return string.sub(envelope, 1, -2) .. CKPT_MARK
end

local function carry_mark(old, new)
  if old and marked(old) then
    return mark(new)
  end
  return new
end

-- stats is the queue's P:{Q}:stats (the state key shares its base and slot)
local function drop_state(stats, envelope)
  if envelope and marked(envelope) then
    local jid = string.match(envelope, '^{"jid":"([^"]*)"')
    if jid then
      redis.call('DEL', string.sub(stats, 1, -6) .. 'state:' .. jid)
    end
  end
end
