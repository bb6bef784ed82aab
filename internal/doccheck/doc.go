// Package doccheck holds the test that keeps the documentation's names
// true: every repository path, relative link and Go import path that
// README.md, ARCHITECTURE.md or docs/*.md names must exist. It has no API;
// its test reads the files and the tree, and needs no server.
package doccheck
