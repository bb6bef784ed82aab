// Package secretfile reads the small files that configuration names for
// secrets and certificates.
package secretfile

import (
	"fmt"
	"io"
	"os"
)

// Read reads a regular file of at most limit bytes, so that a configuration
// naming a device or a pipe fails instead of hanging, and one naming a
// large file fails instead of reading it.
func Read(path string, limit int64) ([]byte, error) {
	// Stat before opening: opening a FIFO would block.
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return b, nil
}
