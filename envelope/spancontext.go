package envelope

import "strings"

// TraceparentColumn returns the W3C traceparent stored in an outbox row's
// trace column. A bare traceparent is returned as it is. Debezium's
// tracingspancontext column holds java.util.Properties text instead
// ("#comment\ntraceparent=00-...\ntracestate=..."): then the value of its
// traceparent key is returned, or "" when it has none. The result is not
// validated; pass it to Trace.
func TraceparentColumn(v string) string {
	if validTraceparent(v) || !strings.ContainsAny(v, "=:\n") {
		return v // the common case: a bare traceparent, or nothing
	}
	for line := range strings.Lines(v) {
		line = strings.TrimLeft(line, " \t\f")
		line = strings.TrimRight(line, "\r\n")
		if line == "" || line[0] == '#' || line[0] == '!' {
			continue
		}
		// A key ends at the first unescaped '=', ':' or whitespace; the
		// separator may be surrounded by whitespace. traceparent values and
		// the key itself contain no escapes.
		end := strings.IndexAny(line, "=: \t\f")
		if end < 0 || line[:end] != "traceparent" {
			continue
		}
		rest := strings.TrimLeft(line[end:], " \t\f")
		if rest != "" && (rest[0] == '=' || rest[0] == ':') {
			rest = strings.TrimLeft(rest[1:], " \t\f")
		}
		return strings.TrimRight(rest, " \t\f")
	}
	return ""
}
