package cdc

import "context"

// walOrder hands a transaction's inserts and transactional messages to a
// Handler in the order they were written, where PostgreSQL's decoding
// does not.
//
// PostgreSQL files a row change under the start of its WAL record and a
// transactional logical message under the end of its own (decode.c
// DecodeLogicalMsgOp queues it at buf->endptr). A message and the record
// right after it therefore share one position. When the two belong to
// different subtransactions of one transaction (a message written inside a
// savepoint, then a row after RELEASE SAVEPOINT), the reorder buffer merges
// the subtransactions by position with no tie-break, and can decode the row
// first: the reproduction is in TestEmitInSubtransactionKeepsOrder.
//
// The swap is recognisable. An insert at position P is followed, in WAL, by
// records that start at or after P's record ends; a message that ends there
// has a position past P. A message with position P decoded right after the
// insert at P ended where the insert began: it was written first. And ties
// only pair a record ending at P with the one starting there, so a swapped
// message always comes next. walOrder therefore holds each insert until the
// next event and delivers such a message ahead of it.
//
// Not safe for concurrent use; the zero value is ready.
type walOrder struct {
	held   bool
	ins    Insert
	values [][]byte
	buf    []byte
}

// insert delivers the insert held so far and holds ins, copying the WAL data
// it aliases.
func (o *walOrder) insert(ctx context.Context, h Handler, ins *Insert) error {
	if err := o.flush(ctx, h); err != nil {
		return err
	}
	n := 0
	for _, v := range ins.Values {
		n += len(v)
	}
	if o.buf == nil || cap(o.buf) < n {
		o.buf = make([]byte, 0, n) // never nil: an empty value is not NULL
	}
	o.buf = o.buf[:0]
	o.values = o.values[:0]
	for _, v := range ins.Values {
		if v == nil {
			o.values = append(o.values, nil)
			continue
		}
		start := len(o.buf)
		o.buf = append(o.buf, v...) // within capacity: earlier values stay valid
		o.values = append(o.values, o.buf[start:len(o.buf):len(o.buf)])
	}
	o.ins = Insert{Relation: ins.Relation, Values: o.values, LSN: ins.LSN}
	o.held = true
	return nil
}

// message delivers msg, ahead of the held insert when msg was written before it.
func (o *walOrder) message(ctx context.Context, h Handler, msg *LogicalMessage) error {
	if o.held && msg.Transactional && msg.LSN == o.ins.LSN {
		if err := h.Message(ctx, msg); err != nil {
			return err
		}
		return o.flush(ctx, h)
	}
	if err := o.flush(ctx, h); err != nil {
		return err
	}
	return h.Message(ctx, msg)
}

// flush delivers the held insert, if any.
func (o *walOrder) flush(ctx context.Context, h Handler) error {
	if !o.held {
		return nil
	}
	o.held = false
	return h.Insert(ctx, &o.ins)
}
