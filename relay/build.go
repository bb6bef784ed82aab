package relay

import (
	"context"
	"fmt"

	"github.com/outboxrelay/outboxrelay/cdc"
)

// A Builder makes messages for outbox rows read back from their table
// (replay, recovery) exactly as the relay makes them from the WAL: the same
// envelope, message_id, trace id, headers and destination fields. Only what
// the table does not hold differs: the source's WAL positions are those the
// caller passes in tx and LSN (zero when unknown).
//
// A Builder is not safe for concurrent use.
type Builder struct {
	r *Relay
}

// NewBuilder returns a Builder for the pipeline configuration cfg (its
// Database, Tables, Resolve, Columns, Format and CloudEventsSource count).
func NewBuilder(cfg Config) *Builder {
	return &Builder{r: New(cfg, nil, nil)}
}

// Row builds the message for one row of rel, whose Values are in
// PostgreSQL's text output, one per column of rel, as pgoutput sends them.
// tx is the row's transaction as far as it is known. As in the relay, an
// invalid row still yields a message, with the reason it cannot be sent.
func (b *Builder) Row(ctx context.Context, rel *cdc.Relation, ins *cdc.Insert, tx cdc.Begin) (*Message, error) {
	mp, err := b.r.mapping(ctx, rel)
	if err != nil {
		return nil, err
	}
	if mp.skip {
		return nil, fmt.Errorf("table %s is not relayed", rel.QualifiedName())
	}
	b.r.cur = tx
	m, buildErr := b.r.buildRow(mp, ins)
	// The caller owns the message: its buffer never returns to the pool.
	m.pooled = false
	return m, buildErr
}
