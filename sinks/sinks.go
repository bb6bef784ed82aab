// Package sinks is what every outboxrelay sink shares: the registry through
// which a sink package makes itself known to the configuration and the
// command (its name, its settings with their defaults, how it is opened and
// checked, and the warnings it gives), the file form of TLS settings, and
// the one mapping of a message onto broker headers ([Binding]).
//
// A sink is added by writing its package, which calls [Register] from its
// init function, and importing that package once, in config/sinks.go.
// Nothing else names sinks: configuration keys, environment variables,
// validation, the README's reference and the command's wiring all come from
// the registry.
package sinks

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/route"
	"github.com/outboxrelay/outboxrelay/verify"
)

// Settings is one sink's section of the configuration file, sink.<name>:
// a pointer to the sink package's own configuration struct. Its yaml tags
// are the keys (OUTBOXRELAY_SINK_<NAME>_<KEY> in the environment), [Type.Docs]
// describes them in the generated reference (docs/configuration.md), and a field
// tagged secret:"url" or secret:"text" is hidden when the configuration is
// printed and may be read from its _file sibling. Fields tagged yaml:"-"
// are for programs that use the sink package directly.
type Settings interface {
	// Validate reports every problem at once, each one sentence naming the
	// key under sink.<name> to fix.
	Validate() error
	// Warnings lists settings that work but leave something exposed, and
	// deprecated keys that are set ([Renamed]), each naming the setting and
	// its fix.
	Warnings() []string
	// Open creates the sink and checks that its broker answers, so that an
	// unreachable broker or a rejected login at start is one clear error
	// that names the settings to check. The caller closes the sink.
	Open(ctx context.Context, log *zap.Logger) (relay.Sink, error)
}

// FormatChecker is implemented by the Settings of a sink whose options
// depend on envelope.format. The configuration calls it at load time, so
// that a combination that could never publish is refused before the relay
// starts, naming both settings.
type FormatChecker interface {
	CheckFormat(format relay.Format) error
}

// Type is a registered sink.
type Type struct {
	// Name is the sink.type value and the name of its configuration
	// section: lowercase letters and digits.
	Name string
	// Defaults returns new settings holding the sink's defaults; they are
	// what an unset key means.
	Defaults func() Settings
	// Docs describes every key of the settings for the README's
	// reference, by its path under sink.<name> (tls.ca_file); a test fails
	// when a key has none.
	Docs map[string]string
}

var registry struct {
	sync.RWMutex
	types map[string]Type
}

// Register makes a sink known. It is called from the init function of the
// sink's package, like database/sql drivers and image formats register: a
// blank import is then all a program needs to offer the sink. It panics
// when the name is taken or malformed, a programming error.
func Register(t Type) {
	if t.Name == "" || strings.Trim(t.Name, "abcdefghijklmnopqrstuvwxyz0123456789") != "" || t.Defaults == nil {
		panic(fmt.Sprintf("sinks: Register(%q): a name of lowercase letters and digits and a Defaults function are required", t.Name))
	}
	registry.Lock()
	defer registry.Unlock()
	if _, dup := registry.types[t.Name]; dup {
		panic("sinks: Register called twice for " + t.Name)
	}
	if registry.types == nil {
		registry.types = map[string]Type{}
	}
	registry.types[t.Name] = t
}

// Types returns the registered sinks sorted by name.
func Types() []Type {
	registry.RLock()
	defer registry.RUnlock()
	ts := make([]Type, 0, len(registry.types))
	for _, t := range registry.types {
		ts = append(ts, t)
	}
	slices.SortFunc(ts, func(a, b Type) int { return strings.Compare(a.Name, b.Name) })
	return ts
}

// Lookup returns the sink registered as name.
func Lookup(name string) (Type, bool) {
	registry.RLock()
	defer registry.RUnlock()
	t, ok := registry.types[name]
	return t, ok
}

// Names returns the registered names, sorted, for error messages.
func Names() []string {
	var names []string
	for _, t := range Types() {
		names = append(names, t.Name)
	}
	return names
}

// RelayOnly is implemented by Settings whose sink can hold the relay's
// position with its messages (sink.kafka.exactly_once), which only the
// relay's own sink may: the program opens the relay's sink with the
// settings of ForRelay, and any other (dlq replay, verify, a first start's
// backfill) with those of Detached.
type RelayOnly interface {
	// ForRelay returns the settings of the sink of the relay that reads
	// slot.
	ForRelay(slot string) Settings
	// Detached returns the settings of a sink that publishes outside the
	// relay's position.
	Detached() Settings
}

// Verifiable is implemented by Settings whose broker `outboxrelay verify`
// can read back. The command asks the configured sink's settings for it;
// a sink without it cannot be verified, and verify says so.
type Verifiable interface {
	// VerifyReader returns a reader of the message ids the broker holds
	// and, for readers that read per destination, how to render a
	// message's destination as the sink does (nil: the reader reads one
	// place, a stream or a queue, for every message). An error is one
	// sentence naming the setting or the flag to fix.
	VerifyReader(opts VerifyOptions) (verify.Reader, func(*relay.Message) (string, error), error)
}

// VerifyOptions are what the verify command knows beyond the settings.
type VerifyOptions struct {
	// Queue is the verification queue given with --rabbitmq-queue, for a
	// broker that cannot be read without consuming (RabbitMQ): a queue
	// bound to the sink's destination that holds a copy of every message.
	Queue string
}

// Destinations returns how a sink whose destination is the template tmpl
// (see package route) names a message's destination, unescaped, for a
// Verifiable's reader.
func Destinations(tmpl string) (func(*relay.Message) (string, error), error) {
	t, err := route.Parse(tmpl)
	if err != nil {
		return nil, err
	}
	return func(m *relay.Message) (string, error) { return t.Render(m, nil), nil }, nil
}

// StaticDestination returns tmpl as the one destination of every message
// when it has no placeholder, so that per-destination metrics exist from
// the start, and nothing otherwise.
func StaticDestination(tmpl string) []string {
	if tmpl == "" || strings.Contains(tmpl, "{") {
		return nil
	}
	return []string{tmpl}
}

// Connector is a sink that connects in a step of its own, after its New.
type Connector interface {
	relay.Sink
	Connect(ctx context.Context) error
}

// Unreachable is the unreachable function of [Open] for a sink whose
// Connect error names what to check: "cannot reach <broker>: <err>".
func Unreachable(broker string) func(error) error {
	return func(err error) error { return fmt.Errorf("cannot reach %s: %w", broker, err) }
}

// Open is the body of a sink's [Settings.Open], given what the sink
// package's New returned: New's error is a configuration error, reported
// under sink.<name>; otherwise Open connects s and, when that fails,
// closes s and returns unreachable(err), one sentence that names what to
// check.
func Open(ctx context.Context, name string, s Connector, err error, unreachable func(error) error) (relay.Sink, error) {
	if err != nil {
		return nil, fmt.Errorf("sink.%s: %w", name, err)
	}
	if err := s.Connect(ctx); err != nil {
		_ = s.Close()
		return nil, unreachable(err)
	}
	return s, nil
}
