package envelope

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestParseTimestamp(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Time
	}{
		{"2026-11-29 08:00:00.123456+00", time.Date(2026, 11, 29, 8, 0, 0, 123456000, time.UTC)},
		{"2026-11-29 08:00:00+00", time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)},
		{"2026-11-29 08:00:00.5+05:30", time.Date(2026, 11, 29, 2, 30, 0, 500000000, time.UTC)},
		{"2026-11-29 08:00:00-03:30:15", time.Date(2026, 11, 29, 11, 30, 15, 0, time.UTC)},
		{"2026-11-29 23:59:59.999999-10", time.Date(2026, 11, 30, 9, 59, 59, 999999000, time.UTC)},
		{"2026-11-29T08:00:00.123456789+01", time.Date(2026, 11, 29, 7, 0, 0, 123456789, time.UTC)},
		{"2024-02-29 00:00:00+00", time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC)},
		{"2000-02-29 00:00:00+00", time.Date(2000, 2, 29, 0, 0, 0, 0, time.UTC)},
		{"0001-01-01 00:00:00+00", time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"1900-01-01 00:00:00+00:19:32", time.Date(1899, 12, 31, 23, 40, 28, 0, time.UTC)},
		{"294276-12-31 23:59:59.999999+00", time.Date(294276, 12, 31, 23, 59, 59, 999999000, time.UTC)},
	} {
		got, err := ParseTimestamp([]byte(tc.in))
		if err != nil {
			t.Errorf("ParseTimestamp(%q): %v", tc.in, err)
			continue
		}
		if !got.Equal(tc.want) || got.Location() != time.UTC {
			t.Errorf("ParseTimestamp(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestParseTimestampErrors(t *testing.T) {
	for _, in := range []string{
		"", "infinity", "-infinity", "0001-01-01 00:00:00+00 BC", "2026-11-29 08:00:00",
		"2026-11-29", "26-11-29 08:00:00+00", "2026-13-01 00:00:00+00", "2026-00-01 00:00:00+00",
		"2026-02-29 00:00:00+00", "1900-02-29 00:00:00+00", "2026-04-31 00:00:00+00", "2026-01-00 00:00:00+00",
		"2026-11-29 24:00:00+00", "2026-11-29 08:60:00+00", "2026-11-29 08:00:60+00",
		"2026-11-29 08:00:00.+00", "2026-11-29 08:00:00.1234567890+00", "2026-11-29 08:00:00+0",
		"2026-11-29 08:00:00+0530", "2026-11-29 08:00:00+05:3", "2026-11-29 08:00:00+05:30:", "2026-11-29 08:00:00+24",
		"2026-11-29 08:00:00+05:60", "2026-11-29 08:00:00Z", "2026-11-29 08:00:00 +00", "2026/11/29 08:00:00+00",
		"2026-11-29 08:00:00+00x", "0000-01-01 00:00:00+00", "1234567-01-01 00:00:00+00", "2026-1a-29 08:00:00+00",
	} {
		got, err := ParseTimestamp([]byte(in))
		if err == nil {
			t.Errorf("ParseTimestamp(%q) = %v, want an error", in, got)
			continue
		}
		if msg := err.Error(); !strings.HasPrefix(msg, "parse timestamp ") {
			t.Errorf("ParseTimestamp(%q) error %q", in, msg)
		}
	}
}

func TestParseTimestampAllocs(t *testing.T) {
	skipUnderRace(t)
	b := []byte("2026-11-29 08:00:00.123456+00")
	if n := testing.AllocsPerRun(100, func() { ParseTimestamp(b) }); n != 0 {
		t.Errorf("ParseTimestamp allocates %v times", n)
	}
}

// pgTimestampRE matches what PostgreSQL writes with a four-digit year and
// an offset time.Parse checks as strictly as ParseTimestamp does.
var pgTimestampRE = regexp.MustCompile(`^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d{1,9})?[+-]([01]\d|2[0-3])(:[0-5]\d){0,2}$`)

func FuzzParseTimestamp(f *testing.F) {
	f.Add("2026-11-29 08:00:00.123456+00")
	f.Add("2026-11-29 08:00:00-03:30:15")
	f.Add("infinity")
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseTimestamp([]byte(s))
		if err != nil {
			if got != (time.Time{}) {
				t.Fatalf("ParseTimestamp(%q) returned %v with error %v", s, got, err)
			}
			if pgTimestampRE.MatchString(s) && !strings.HasPrefix(s, "0000") {
				if _, perr := time.Parse(layoutFor(s), strings.Replace(s, "T", " ", 1)); perr == nil {
					t.Fatalf("ParseTimestamp(%q): %v, but time.Parse accepts it", s, err)
				}
			}
			return
		}
		if got.Location() != time.UTC {
			t.Fatalf("ParseTimestamp(%q) = %v, not UTC", s, got)
		}
		if s[4] != '-' { // years beyond 9999 are outside time.Parse's layouts
			return
		}
		want, perr := time.Parse(layoutFor(s), strings.Replace(s, "T", " ", 1))
		if perr != nil || !want.Equal(got) {
			t.Fatalf("ParseTimestamp(%q) = %v, time.Parse = %v, %v", s, got, want, perr)
		}
	})
}

// layoutFor picks the time.Parse layout for the offset form s ends with.
func layoutFor(s string) string {
	i := strings.LastIndexAny(s, "+-")
	switch len(s) - i {
	case 6:
		return "2006-01-02 15:04:05.999999999-07:00"
	case 9:
		return "2006-01-02 15:04:05.999999999-07:00:00"
	}
	return "2006-01-02 15:04:05.999999999-07"
}

func BenchmarkParseTimestamp(b *testing.B) {
	in := []byte("2026-11-29 08:00:00.123456+00")
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		if _, err := ParseTimestamp(in); err != nil {
			b.Fatal(err)
		}
	}
}
