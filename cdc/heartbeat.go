package cdc

import (
	"context"
	"strconv"
	"time"

	"go.uber.org/zap"
)

// HeartbeatPrefix is the prefix of the relay's heartbeat messages.
const HeartbeatPrefix = "outboxrelay.heartbeat"

// Heartbeat writes a transactional logical decoding message every interval.
// When the outbox tables are quiet while other tables write WAL, pgoutput
// sends nothing for the slot; the heartbeat's own transaction gives the
// relay a commit to confirm past, so the slot does not pin WAL. It runs until
// ctx is done; failures are logged and retried at the next tick.
func Heartbeat(ctx context.Context, db Querier, interval time.Duration, log *zap.Logger) error {
	if interval <= 0 {
		return nil
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		beatCtx, cancel := context.WithTimeout(ctx, interval)
		_, err := db.Exec(beatCtx, "SELECT pg_logical_emit_message(true, $1, $2)", HeartbeatPrefix, strconv.FormatInt(time.Now().UnixMilli(), 10))
		cancel()
		if err != nil && ctx.Err() == nil {
			log.Warn("heartbeat failed", zap.Error(err))
		}
	}
}
