package relay

import "github.com/jackc/pglogrepl"

// txn is one source transaction in flight.
type txn struct {
	end       pglogrepl.LSN
	pending   int
	committed bool
}
