package config

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/outboxrelay/outboxrelay/sinks"
)

// Sinks is the sinks section: several sinks fed from the one slot, each
// under a name that routes pick it by (routes[i].sink), in file order.
// Each value is written as a sink section is (type and that sink's
// section). When set it replaces the sink section.
type Sinks []NamedSink

// NamedSink is one entry of the sinks section.
type NamedSink struct {
	Name string
	Sink Sink
}

var sinksType = reflect.TypeOf(Sinks(nil))

// Names returns the sinks' names in file order.
func (s Sinks) Names() []string {
	names := make([]string, len(s))
	for i, n := range s {
		names[i] = n.Name
	}
	return names
}

// UnmarshalYAML decodes a mapping of names to sink sections, keeping the
// file's order: the first sink takes what no route sends elsewhere.
func (s *Sinks) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: sinks must be a mapping of names to sink sections (type and its section)", n.Line)
	}
	*s = nil
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		ns := NamedSink{Name: k.Value, Sink: defaultSink("")}
		if err := v.Decode(&ns.Sink); err != nil {
			return fmt.Errorf("sinks.%s: %w", k.Value, err)
		}
		*s = append(*s, ns)
	}
	return nil
}

// MarshalYAML writes the mapping in file order.
func (s Sinks) MarshalYAML() (any, error) {
	n := &yaml.Node{Kind: yaml.MappingNode}
	for _, ns := range s {
		var val yaml.Node
		if err := val.Encode(ns.Sink); err != nil {
			return nil, err
		}
		n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: ns.Name}, &val)
	}
	return n, nil
}

func (s Sinks) clone() Sinks {
	if s == nil {
		return nil
	}
	c := make(Sinks, len(s))
	for i, ns := range s {
		c[i] = NamedSink{Name: ns.Name, Sink: ns.Sink.clone()}
	}
	return c
}

// checkSinks checks the sinks section's mapping: each value as a sink section.
func checkSinks(n *yaml.Node, path string) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: %s must be a mapping of names to sink sections, not %s", n.Line, path, describe(n))
	}
	var errs []error
	for i := 0; i+1 < len(n.Content); i += 2 {
		errs = append(errs, checkSink(n.Content[i+1], joinPath(path, n.Content[i].Value)))
	}
	return errors.Join(errs...)
}

// SinkList returns the sinks the pipeline runs: the sinks section, or the
// sink section as one sink named "".
func (c *Config) SinkList() Sinks {
	if len(c.Sinks) > 0 {
		return c.Sinks
	}
	return Sinks{{Sink: c.Sink}}
}

// validateSinks checks the sinks section and that every route names a
// sink it has.
func (c *Config) validateSinks() []error {
	var errs []error
	if len(c.Sinks) > 0 && len(c.Pipelines) > 0 {
		errs = append(errs, errors.New("sinks cannot be combined with pipelines yet; give each pipeline its one sink"))
	}
	seen := map[string]bool{}
	for _, ns := range c.Sinks {
		at := "sinks." + ns.Name
		switch {
		case ns.Name == "" || strings.ContainsAny(ns.Name, " \t\r\n\"'{}"):
			errs = append(errs, fmt.Errorf("%s: a sink name must be a non-empty word", at))
		case seen[ns.Name]:
			errs = append(errs, fmt.Errorf("%s is listed twice", at))
		}
		seen[ns.Name] = true
		set := ns.Sink.Settings()
		if set == nil {
			errs = append(errs, fmt.Errorf("%s.type %q is not one of %s", at, ns.Sink.Type, strings.Join(sinks.Names(), ", ")))
			continue
		}
		for _, e := range Problems(set.Validate()) {
			errs = append(errs, fmt.Errorf("%s: %w", at, e))
		}
		if fc, ok := set.(sinks.FormatChecker); ok {
			if err := fc.CheckFormat(c.Envelope.Format); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", at, err))
			}
		}
		// Detached differs from the settings only when they hold the
		// relay's position (exactly once), which one slot cannot share
		// among sinks that confirm apart.
		if rs, ok := set.(sinks.RelayOnly); ok && rs.Detached() != set {
			errs = append(errs, fmt.Errorf("%s: exactly_once needs the sink to be the slot's only one; use the sink section", at))
		}
	}
	for i, r := range c.Routes {
		if r.Sink == "" {
			continue
		}
		if len(c.Sinks) == 0 {
			errs = append(errs, fmt.Errorf("routes[%d] (%s).sink %q: there is no sinks section to name; list the sinks under sinks", i, r.Name, r.Sink))
			continue
		}
		if !slices.Contains(c.Sinks.Names(), r.Sink) {
			errs = append(errs, fmt.Errorf("routes[%d] (%s).sink %q is not a sink; sinks are %s", i, r.Name, r.Sink, strings.Join(c.Sinks.Names(), ", ")))
		}
	}
	return errs
}
