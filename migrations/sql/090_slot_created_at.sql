-- When the slot was created, recorded just after by whoever created it
-- (migrate or the relay): a relay's first start that finds the slot without
-- a recorded position publishes from the tables only the rows whose
-- transactions began before then; later ones are in the slot.
{{template "addColumn" (args "outboxrelay.checkpoint" "slot_created_at" "timestamptz")}}
