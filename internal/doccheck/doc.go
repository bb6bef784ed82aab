// Package doccheck holds the tests that keep the documentation true: every
// repository path, relative link and Go import path that README.md,
// ARCHITECTURE.md or docs/*.md names must exist, the README's ten-line
// configuration must load, and docs/debezium.md must map every option of
// Debezium's outbox event router. It has no API; its tests read the files
// and the tree, and need no server.
package doccheck
