package main

import (
	"github.com/outboxrelay/outboxrelay/internal/config"
)

// checkTemplates checks the configured sink's settings, destination
// templates included, with the sink's own rules and without connecting, so
// that `run --check-config` rejects a typo such as {aggregate_typo} exactly
// as `run` does.
func checkTemplates(cfg config.Config) error {
	if s := cfg.Sink.Settings(); s != nil {
		return s.Validate()
	}
	return nil
}
