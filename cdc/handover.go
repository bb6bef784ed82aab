package cdc

import "context"

// handover is the Handler as the stream hands changes to it across
// sessions: it remembers which changes of the open transaction it handed
// over, so that the session that delivers the transaction again after a
// reconnect (a resume after the in-flight window was full, a lost
// connection) hands over only the changes after them, when the Handler
// keeps what it was handed (Reset). A transaction is known by its commit
// position, a change within it by its WAL position and, as a transactional
// message and the row after it may share one (walOrder), by how many
// changes before it had that position: PostgreSQL decodes a transaction
// from the same WAL the same way every time.
//
// Transactions that committed before the Handler confirmed them come again
// in full after a lost connection. When the Handler keeps what it was
// handed, they are not handed over again: the Handler has them whole
// (their messages are published or in flight), and a transaction is
// delivered again only by a later session of the same Run.
//
// Stream goroutine only, as the Handler's methods it wraps.
type handover struct {
	Handler
	// open is what was handed over of the open transaction, in this session
	// or an earlier one.
	open handed
	// earlier is what an earlier session handed over of a transaction
	// that it abandoned: those changes are not handed over again.
	earlier handed
	// through is the commit position of the last transaction handed over
	// whole while the Handler keeps what it is handed, 0 for none: a
	// transaction at or before it comes again only because its position was
	// not confirmed before a session ended, and is skipped whole
	// (skipping).
	through  LSN
	skipping bool
}

// handed is the progress of one transaction.
type handed struct {
	final  LSN // the transaction's commit position, 0 for none
	last   LSN // the position of the last change handed over
	atLast int // the changes at last handed over
}

// next moves to a change at lsn.
func (p *handed) next(lsn LSN) {
	if lsn == p.last {
		p.atLast++
		return
	}
	p.last, p.atLast = lsn, 1
}

// covers reports whether q, a later point of the same transaction, is at or
// before p.
func (p handed) covers(q handed) bool {
	return p.final != 0 && p.final == q.final &&
		(q.last < p.last || (q.last == p.last && q.atLast <= p.atLast))
}

func (v *handover) Begin(ctx context.Context, b Begin) error {
	if v.through != 0 && b.FinalLSN <= v.through {
		v.skipping = true
		return nil
	}
	v.open = handed{final: b.FinalLSN}
	if v.earlier.final != 0 && v.earlier.final < b.FinalLSN {
		v.earlier = handed{} // passed: it never came again
	}
	return v.Handler.Begin(ctx, b)
}

func (v *handover) Insert(ctx context.Context, ins *Insert) error {
	if v.skipping || v.skip(ins.LSN) {
		return nil
	}
	return v.Handler.Insert(ctx, ins)
}

func (v *handover) Message(ctx context.Context, msg *LogicalMessage) error {
	// A non-transactional message is no part of a transaction: it is
	// decoded at its own position, once.
	if msg.Transactional && (v.skipping || v.skip(msg.LSN)) {
		return nil
	}
	return v.Handler.Message(ctx, msg)
}

func (v *handover) Commit(ctx context.Context, c Commit) error {
	if v.skipping {
		v.skipping = false
		return nil
	}
	if v.open.final == v.earlier.final {
		v.earlier = handed{}
	}
	final := v.open.final
	v.open = handed{}
	if err := v.Handler.Commit(ctx, c); err != nil {
		return err
	}
	v.through = final
	return nil
}

// Reset ends a session: the open transaction's changes handed over so far
// are remembered when the Handler keeps them.
func (v *handover) Reset() bool {
	kept := v.Handler.Reset()
	v.skipping = false
	switch {
	case !kept:
		v.earlier = handed{}
		v.through = 0
	case v.open.final != 0 && !v.earlier.covers(v.open):
		v.earlier = v.open
	}
	v.open = handed{}
	return kept
}

// skip records a change of the open transaction at lsn, and reports whether
// an earlier session handed it over.
func (v *handover) skip(lsn LSN) bool {
	if v.open.final == 0 {
		return false // not in a transaction: nothing to recognise it by
	}
	v.open.next(lsn)
	if v.earlier.covers(v.open) {
		return true
	}
	if v.earlier.final == v.open.final {
		v.earlier = handed{} // the rest is new
	}
	return false
}
