package app

import (
	"errors"
	"fmt"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/internal/config"
	"github.com/outboxrelay/outboxrelay/outbox/schema"
	"github.com/outboxrelay/outboxrelay/relay"
)

// SchemaValidator loads relay.schemas.dir and returns the relay's
// Validator, or nil when no folder is configured.
func SchemaValidator(cfg config.Schemas) (relay.Validator, error) {
	if cfg.Dir == "" {
		return nil, nil
	}
	var opts []schema.Option
	if cfg.Missing == config.SchemasAllow {
		opts = append(opts, schema.AllowMissing())
	}
	set, err := schema.Load(cfg.Dir, opts...)
	if err != nil {
		return nil, fmt.Errorf("relay.schemas.dir: %v", err)
	}
	return relay.ValidateFunc(func(em *envelope.Message) error {
		err := set.Validate(em.EventType, em.SchemaVersion, em.Payload)
		if errors.Is(err, schema.ErrNoSchema) {
			return fmt.Errorf("%w, or set relay.schemas.missing: allow", err)
		}
		return err
	}), nil
}
