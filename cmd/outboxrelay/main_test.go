package main

import (
	"os"
	"strings"
	"testing"
)

// TestMain runs the commands without the OUTBOXRELAY_ variables of the
// environment the tests run in (the CI's OUTBOXRELAY_PG_CACHE, say): they
// would change the configuration the tests load, or add warnings to the
// output the tests check. A test sets what it needs with t.Setenv.
func TestMain(m *testing.M) {
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "OUTBOXRELAY_") {
			os.Unsetenv(name)
		}
	}
	os.Exit(m.Run())
}
