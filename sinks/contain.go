package sinks

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/outboxrelay/outboxrelay/envelope"
)

// InternalPrefix starts the names the relay keeps for itself on every broker,
// such as the Kafka sink's exactly-once positions topic
// (__outboxrelay_positions). No destination rendered from a row may start
// with it, on any sink ([CheckDestination]).
const InternalPrefix = "__outboxrelay_"

// The rules of this file keep a row's content inside the message it
// becomes. Every string a sink sends outside the body (the destination, a
// record key, header names and values) must be valid UTF-8: brokers,
// client libraries and the relay's own metrics take these strings for text,
// and a sink never repairs one, because a repaired key or header would
// disagree with the database and merge distinct values. A message that
// breaks a rule is failed with the error (relay.Permanent), so the relay
// dead-letters it with the reason and goes on.

// CheckDestination reports why a sink may not send to dest, a destination
// rendered from a message: it is not valid UTF-8, or it is one of the
// relay's own names (it starts with [InternalPrefix]). what names the kind
// of destination in the error ("kafka topic", "nats subject"). Each sink
// adds the internal names of its broker with [Internal].
func CheckDestination(what, dest string) error {
	if err := CheckUTF8(what, dest); err != nil {
		return err
	}
	if strings.HasPrefix(dest, InternalPrefix) {
		return Internal(what, dest, "the relay's own use (names starting with "+InternalPrefix+")")
	}
	return nil
}

// Internal is the error for a destination dest that belongs to the relay or
// the broker itself, described by whose.
func Internal(what, dest, whose string) error {
	return fmt.Errorf("%s %q is reserved for %s and no row may address it; change the row's aggregate_type, event_type or table, or the destination template", what, dest, whose)
}

// CheckUTF8 returns an error naming what and the first invalid byte when s
// is not valid UTF-8, and nil otherwise.
func CheckUTF8(what, s string) error {
	if utf8.ValidString(s) {
		return nil
	}
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			break
		}
		i += n
	}
	return fmt.Errorf("%s %q is not valid UTF-8 (byte 0x%02X at offset %d); write the row's values as UTF-8 (a SQL_ASCII database stores any bytes)", what, s, s[i], i)
}

// CheckHeaders returns an error naming the first header of hs whose name
// or value is not valid UTF-8, and nil when there is none. Sinks call it on
// what [Binding.Headers] returns, so that the relay-owned headers rendered
// from row values (aggregate_id, aggregate_type, event_type, the
// CloudEvents attributes) are checked as well as the row's own.
func CheckHeaders(hs []envelope.Header) error {
	for _, h := range hs {
		if err := CheckUTF8("header name", h.Key); err != nil {
			return err
		}
		if utf8.ValidString(h.Value) {
			continue // name the header only for an error: formatting it per header was most of a record's allocations
		}
		if err := CheckUTF8(fmt.Sprintf("header %q value", h.Key), h.Value); err != nil {
			return err
		}
	}
	return nil
}

// Char describes the character at s[i] for an error message: the character
// quoted ('é'), or the byte in hex when s[i] does not start valid UTF-8, so
// that an error never shows one byte of a character as another character.
func Char(s string, i int) string {
	r, n := utf8.DecodeRuneInString(s[i:])
	if r == utf8.RuneError && n <= 1 {
		return fmt.Sprintf("the byte 0x%02X", s[i])
	}
	return fmt.Sprintf("%q", r)
}
