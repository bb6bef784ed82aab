package store

import (
	"time"

	"github.com/outboxrelay/outboxrelay/relay"
)

// record is what the outbox router's options made of a message
// (relay.Message Key, Timestamp and Tombstone), as the record_key,
// record_timestamp and tombstone columns of outboxrelay.dead_letters and
// outboxrelay.parked hold it: NULL for the defaults.
type record struct {
	Key       *string
	Timestamp *time.Time
	Tombstone *bool
}

func recordOf(m *relay.Message) record {
	var r record
	if m.Key != "" && m.Key != m.AggregateID {
		k := clean(m.Key)
		r.Key = &k
	}
	if !m.Timestamp.IsZero() {
		t := m.Timestamp
		r.Timestamp = &t
	}
	if m.Tombstone {
		r.Tombstone = &m.Tombstone
	}
	return r
}

// apply sets r's values on m.
func (r record) apply(m *relay.Message) {
	m.Key = m.AggregateID
	if r.Key != nil {
		m.Key = *r.Key
	}
	if r.Timestamp != nil {
		m.Timestamp = *r.Timestamp
	}
	m.Tombstone = r.Tombstone != nil && *r.Tombstone
}

// bodyOf is m's body for the NOT NULL body columns: a tombstone's, which
// may be nil, is stored empty.
func bodyOf(m *relay.Message) []byte {
	if m.Envelope == nil {
		return []byte{}
	}
	return m.Envelope
}
