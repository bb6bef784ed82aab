//go:build race

package envelope

import "testing"

// skipUnderRace skips an allocation test: the race detector's
// instrumentation allocates on its own, so the counts mean nothing there.
// make test runs each package without -race too, where these tests count.
func skipUnderRace(t *testing.T) {
	t.Helper()
	t.Skip("allocation counts are not meaningful under the race detector")
}
