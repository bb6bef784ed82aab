package relay

import (
	"context"

	"github.com/outboxrelay/outboxrelay/cdc"
)

// Unordered makes r hand every message to the sink at once, as the relay did
// before the per-aggregate order: the reference of BenchmarkAggregateOrder.
func Unordered(r *Relay) { r.pub.unordered = true }

// BuildRows builds every message of one row, as the relay does: one per
// route the row takes.
func BuildRows(b *Builder, ctx context.Context, rel *cdc.Relation, ins *cdc.Insert, tx cdc.Begin) ([]*Message, error) {
	mp, err := b.mapping(ctx, rel)
	if err != nil {
		return nil, err
	}
	b.begin(tx)
	return b.buildRows(mp, ins)
}
