package envelope

import (
	"bytes"
	"fmt"
	"time"
)

// ParseTimestamp parses a timestamptz as PostgreSQL writes it with
// DateStyle ISO ("2026-11-29 08:00:00.123456+00"): a year of four or more
// digits, an optional fraction of up to nine digits, and a UTC offset of
// hours, hours:minutes or hours:minutes:seconds. A 'T' between date and
// time is accepted too. The result is in UTC.
//
// infinity, -infinity, BC dates, a missing offset and out-of-range fields
// (February 30th, hour 24) are errors: none of them is a time a message can
// have occurred at.
func ParseTimestamp(b []byte) (time.Time, error) {
	t, msg := parseTimestamp(b)
	if msg != "" {
		return time.Time{}, fmt.Errorf("parse timestamp %q: %s", truncate(b, 64), msg)
	}
	return t, nil
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

func parseTimestamp(b []byte) (time.Time, string) {
	if string(b) == "infinity" || string(b) == "-infinity" {
		return time.Time{}, "infinite timestamps are not supported"
	}
	if bytes.HasSuffix(b, []byte(" BC")) {
		return time.Time{}, "BC dates are not supported"
	}
	// Year: four or more digits, as many as PostgreSQL needs (up to 294276).
	i := 0
	for i < len(b) && isDigit(b[i]) {
		i++
	}
	if i < 4 || i > 6 {
		return time.Time{}, "want YYYY-MM-DD HH:MM:SS[.ffffff]+HH[:MM[:SS]]"
	}
	year := 0
	for _, c := range b[:i] {
		year = year*10 + int(c-'0')
	}
	// Fixed part after the year: "-MM-DD HH:MM:SS" is 15 bytes.
	f := b[i:]
	if len(f) < 15 || f[0] != '-' || f[3] != '-' || (f[6] != ' ' && f[6] != 'T') ||
		f[9] != ':' || f[12] != ':' {
		return time.Time{}, "want YYYY-MM-DD HH:MM:SS[.ffffff]+HH[:MM[:SS]]"
	}
	month, ok1 := num2(f[1:])
	day, ok2 := num2(f[4:])
	hour, ok3 := num2(f[7:])
	minute, ok4 := num2(f[10:])
	sec, ok5 := num2(f[13:])
	if !(ok1 && ok2 && ok3 && ok4 && ok5) {
		return time.Time{}, "want YYYY-MM-DD HH:MM:SS[.ffffff]+HH[:MM[:SS]]"
	}
	if year == 0 || month < 1 || month > 12 || day < 1 || day > daysIn(month, year) ||
		hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, "field out of range"
	}
	f = f[15:]
	nsec := 0
	if len(f) > 0 && f[0] == '.' {
		n := 1
		for n < len(f) && isDigit(f[n]) {
			n++
		}
		digits := n - 1
		if digits == 0 || digits > 9 {
			return time.Time{}, "want 1 to 9 fraction digits"
		}
		for _, c := range f[1:n] {
			nsec = nsec*10 + int(c-'0')
		}
		for k := digits; k < 9; k++ {
			nsec *= 10
		}
		f = f[n:]
	}
	// Offset: +HH, +HH:MM or +HH:MM:SS.
	if len(f) == 0 {
		return time.Time{}, "missing UTC offset"
	}
	if (f[0] != '+' && f[0] != '-') || (len(f) != 3 && len(f) != 6 && len(f) != 9) {
		return time.Time{}, "want a UTC offset +HH, +HH:MM or +HH:MM:SS"
	}
	offset := 0
	for k := 1; k < len(f); k += 3 {
		v, ok := num2(f[k:])
		if !ok || (k > 1 && f[k-1] != ':') || (k == 1 && v > 23) || v > 59 {
			return time.Time{}, "want a UTC offset +HH, +HH:MM or +HH:MM:SS"
		}
		offset = offset*60 + v
	}
	for k := len(f); k < 9; k += 3 {
		offset *= 60
	}
	if f[0] == '-' {
		offset = -offset
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	return t.Add(-time.Duration(offset) * time.Second), ""
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func num2(b []byte) (int, bool) {
	if !isDigit(b[0]) || !isDigit(b[1]) {
		return 0, false
	}
	return int(b[0]-'0')*10 + int(b[1]-'0'), true
}

func daysIn(month, year int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}
