package main

import (
	"errors"
	"fmt"

	"github.com/outboxrelay/outboxrelay/internal/config"
)

// checkTemplates checks the configured sinks' settings, destination
// templates included, with each sink's own rules and without connecting,
// so that `run --check-config` rejects a typo such as {aggregate_typo}
// exactly as `run` does.
func checkTemplates(cfg config.Config) error {
	var errs []error
	for _, ns := range cfg.SinkList() {
		s := ns.Sink.Settings()
		if s == nil {
			continue
		}
		if err := s.Validate(); err != nil {
			if ns.Name != "" {
				err = fmt.Errorf("sinks.%s: %w", ns.Name, err)
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
