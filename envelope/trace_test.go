package envelope

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"
	"testing"
)

const msgID = "0193a5b0-7d4e-7c1a-9f3e-2b8c1d0e4f5a"

func derived(id string) (string, string) {
	sum := sha256.Sum256([]byte(id))
	trace := hex.EncodeToString(sum[:16])
	return trace, "00-" + trace + "-" + hex.EncodeToString(sum[16:24]) + "-00"
}

func TestTrace(t *testing.T) {
	dTrace, dTP := derived(msgID)
	for _, tc := range []struct {
		name, tp string
		valid    bool
	}{
		{"valid sampled", validTP, true},
		{"valid not sampled", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", true},
		{"unknown flags", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff", true},
		{"future version", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", true},
		{"future version with more fields", "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds", true},
		{"future version, no dash after flags", "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01.x", false},
		{"future version, control character", "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-a\nb", false},
		{"version 00 too long", validTP + "-x", false},
		{"version ff", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false},
		{"uppercase", strings.ToUpper(validTP), false},
		{"uppercase trace id", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", false},
		{"uppercase version", "0A-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false},
		{"zero trace id", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", false},
		{"zero parent id", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", false},
		{"short", validTP[:54], false},
		{"long", validTP + "0", false},
		{"wrong separator", "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false},
		{"non-hex", "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01", false},
		{"surrounding space", " " + validTP, false},
		{"empty", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, tp := Trace(tc.tp, msgID)
			if tc.valid {
				if tp != tc.tp || id != tc.tp[3:35] {
					t.Errorf("Trace(%q) = %q, %q; want it kept", tc.tp, id, tp)
				}
				return
			}
			if id != dTrace || tp != dTP {
				t.Errorf("Trace(%q) = %q, %q; want derived %q, %q", tc.tp, id, tp, dTrace, dTP)
			}
		})
	}
}

func TestTraceDeterministic(t *testing.T) {
	id1, tp1 := Trace("", msgID)
	id2, tp2 := Trace("garbage", msgID)
	if id1 != id2 || tp1 != tp2 {
		t.Errorf("same message id, different traces: %s %s", tp1, tp2)
	}
	if _, tp3 := Trace("", msgID+"x"); tp3 == tp1 {
		t.Errorf("different message ids, same trace %s", tp1)
	}
	long := strings.Repeat("x", 1000) // beyond the stack buffer
	if id, tp := Trace("", long); tp != mustDerived(long) || id != tp[3:35] {
		t.Errorf("Trace of a long id = %s", tp)
	}
}

func mustDerived(id string) string { _, tp := derived(id); return tp }

func TestTraceAllocs(t *testing.T) {
	skipUnderRace(t)
	if n := testing.AllocsPerRun(100, func() { Trace(validTP, msgID) }); n != 0 {
		t.Errorf("Trace with a valid traceparent allocates %v times", n)
	}
	if n := testing.AllocsPerRun(100, func() { Trace("", msgID) }); n != 1 {
		t.Errorf("Trace deriving a traceparent allocates %v times, want 1", n)
	}
}

func TestNonZero(t *testing.T) {
	id := make([]byte, 8)
	nonZero(id)
	if id[7] != 1 {
		t.Errorf("nonZero left %x", id)
	}
	id = []byte{0, 2, 0}
	nonZero(id)
	if id[2] != 0 {
		t.Errorf("nonZero changed a non-zero id to %x", id)
	}
}

// traceparentRE is an independent statement of what Trace accepts.
var traceparentRE = regexp.MustCompile(`^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}(-[\x21-\x7e]*)?$`)

func refValidTraceparent(s string) bool {
	m := traceparentRE.FindStringSubmatch(s)
	if m == nil || m[1] == "ff" || m[2] == strings.Repeat("0", 32) || m[3] == strings.Repeat("0", 16) {
		return false
	}
	return m[1] != "00" || m[4] == ""
}

func FuzzTrace(f *testing.F) {
	f.Add(validTP, msgID)
	f.Add("", "")
	f.Add("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", "\xff")
	f.Fuzz(func(t *testing.T, traceparent, messageID string) {
		id, tp := Trace(traceparent, messageID)
		if !refValidTraceparent(tp) || id != tp[3:35] {
			t.Fatalf("Trace(%q, %q) = %q, %q: not a valid trace", traceparent, messageID, id, tp)
		}
		if refValidTraceparent(traceparent) {
			if tp != traceparent {
				t.Fatalf("Trace(%q) replaced a valid traceparent with %q", traceparent, tp)
			}
			return
		}
		if want := mustDerived(messageID); tp != want {
			t.Fatalf("Trace(%q, %q) = %q, want derived %q", traceparent, messageID, tp, want)
		}
	})
}

func BenchmarkTrace(b *testing.B) {
	b.Run("valid", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			Trace(validTP, msgID)
		}
	})
	b.Run("derived", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			Trace("", msgID)
		}
	})
}
