// Package modules holds no code: its test checks that the repository's Go
// modules (the relay's, the outbox library's, the inbox's, its runners' and
// the chart's test module) require one version of each dependency they
// share, so that a service built from several of them gets the versions
// each was tested with.
package modules
