package app

import (
	"context"
	"sync"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/internal/store"
)

// startWindow is the relay's checkpoint, which also logs, the first time
// this process takes the slot, how far an earlier relay (killed, or a
// replica that held the slot) had published past the slot's confirmed
// position. The slot delivers those messages again and the broker may
// already hold them; this process cannot know which, so
// messages_republished_total does not count them: the log line says how
// large the window was.
type startWindow struct {
	store.Checkpoint
	log  *zap.Logger
	once *sync.Once
}

func newStartWindow(cp store.Checkpoint, log *zap.Logger) startWindow {
	return startWindow{Checkpoint: cp, log: log, once: new(sync.Once)}
}

// CheckSlot implements relay.Checkpoint.
func (w startWindow) CheckSlot(ctx context.Context, slotConfirmed cdc.LSN) error {
	if err := w.Checkpoint.CheckSlot(ctx, slotConfirmed); err != nil {
		return err
	}
	w.once.Do(func() { w.logWindow(ctx, slotConfirmed) })
	return nil
}

// logWindow logs the WAL between the slot's confirmed position and the
// last message recorded as published. The record is written at most once a
// second, so after a kill the window may be larger than logged.
func (w startWindow) logWindow(ctx context.Context, slotConfirmed cdc.LSN) {
	last, ok, err := w.LastPublished(ctx)
	if err != nil {
		w.log.Warn("cannot read how far an earlier relay published past the slot's confirmed position", zap.Error(err))
		return
	}
	if !ok || last < slotConfirmed {
		// After a clean stop this is exact; after a kill the record may
		// trail what the broker acknowledged by up to a second.
		w.log.Info("nothing recorded as published past the slot's confirmed position; after a kill, up to a second of acknowledged messages may not be recorded and come again",
			zap.Stringer("slot_confirmed", slotConfirmed), zap.Int64("window_bytes", 0))
		return
	}
	w.log.Warn("an earlier relay published messages past the slot's confirmed position: the slot delivers them again and the broker may hold them twice; this process cannot know which, so they are not counted as republished",
		zap.Stringer("slot_confirmed", slotConfirmed), zap.Stringer("last_published_lsn", last), zap.Int64("window_bytes", int64(last-slotConfirmed)))
}
