package relay

// Unordered makes r hand every message to the sink at once, as the relay did
// before the per-aggregate order: the reference of BenchmarkAggregateOrder.
func Unordered(r *Relay) { r.pub.unordered = true }
