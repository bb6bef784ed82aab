//go:build !linux

package cpusched

func applyBatch() (int, error) { return 0, ErrUnsupported }
