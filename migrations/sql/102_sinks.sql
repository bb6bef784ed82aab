-- A relay that feeds several sinks from one slot (the sinks section) keeps
-- dead letters and parking apart per sink: a dead letter parks its
-- aggregate on its own sink only, and `dlq replay` sends it back to that
-- sink. '' is the one sink of a sink section, which every row stored
-- before this column existed belongs to.
{{template "addColumn" (args "outboxrelay.dead_letters" "sink" "text NOT NULL DEFAULT ''")}}
{{template "addColumn" (args "outboxrelay.parked" "sink" "text NOT NULL DEFAULT ''")}}
