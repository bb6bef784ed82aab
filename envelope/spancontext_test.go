package envelope

import "testing"

func TestTraceparentColumn(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{tp, tp},
		{"traceparent=" + tp, tp},
		{"#Mon Nov 29 08:00:00 UTC 2026\ntraceparent=" + tp + "\ntracestate=rojo=00f067aa0ba902b7\n", tp},
		{"tracestate=x\r\ntraceparent : " + tp + "\r\n", tp},
		{"! comment\n  traceparent " + tp, tp},
		{"uber-trace-id=abc:def:0:1\n", ""},
		{"traceparentx=" + tp, ""},
	} {
		if got := TraceparentColumn(tc.in); got != tc.want {
			t.Errorf("TraceparentColumn(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
