//go:build !race

package envelope

import "testing"

// skipUnderRace does nothing without the race detector; see race_test.go.
func skipUnderRace(*testing.T) {}
