package config

import (
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/outboxrelay/outboxrelay/relay"
)

// DefaultPipeline is the name of the one pipeline a configuration without
// a pipelines list runs.
const DefaultPipeline = "default"

// Pipeline is one entry of the pipelines list: a source database, its
// slot and tables, a sink and the relay's settings, relayed by a unit of
// its own in the same process. Its sections start as the top-level ones
// (file, then environment) and the keys the entry sets replace theirs;
// http and log stay process-wide.
type Pipeline struct {
	// Name labels the pipeline's metrics, log lines and status.
	Name string `yaml:"name"`
	// Fatal stops the whole process when this pipeline fails; otherwise a
	// failed pipeline is restarted alone, with a backoff, and the others
	// go on.
	Fatal    bool           `yaml:"fatal"`
	Postgres Postgres       `yaml:"postgres"`
	Sink     Sink           `yaml:"sink"`
	Envelope relay.Envelope `yaml:"envelope"`
	Relay    Relay          `yaml:"relay"`

	// raw holds the entry's own sections, laid over the top-level ones by
	// resolvePipelines.
	raw pipelineRaw
}

// pipelineRaw is an entry as written: its sections undecoded, so that they
// can be decoded over a copy of the top-level ones.
type pipelineRaw struct {
	Name     string    `yaml:"name"`
	Fatal    bool      `yaml:"fatal"`
	Postgres yaml.Node `yaml:"postgres"`
	Sink     yaml.Node `yaml:"sink"`
	Envelope yaml.Node `yaml:"envelope"`
	Relay    yaml.Node `yaml:"relay"`
}

// UnmarshalYAML keeps the entry's sections for resolvePipelines; the keys
// were checked against the fields by checkDocument.
func (p *Pipeline) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: each entry of pipelines must be a mapping of name, fatal, postgres, sink, envelope and relay", n.Line)
	}
	if err := n.Decode(&p.raw); err != nil {
		return err
	}
	p.Name, p.Fatal = p.raw.Name, p.raw.Fatal
	return nil
}

// Unit is one pipeline to run, with the whole configuration it runs with.
type Unit struct {
	Name  string
	Fatal bool
	// Config has the pipeline's sections and the process's http and log;
	// its Pipelines is empty.
	Config Config
}

// Units returns the pipelines to run: the pipelines list, or, when there
// is none, the top-level configuration as one pipeline named default.
func (c Config) Units() []Unit {
	if len(c.Pipelines) == 0 {
		return []Unit{{Name: DefaultPipeline, Config: c}}
	}
	out := make([]Unit, 0, len(c.Pipelines))
	for _, p := range c.Pipelines {
		out = append(out, Unit{Name: p.Name, Fatal: p.Fatal, Config: c.pipelineConfig(p)})
	}
	return out
}

// pipelineConfig is p's sections with the process-wide ones of c (the
// routing rules among them: they apply to every pipeline).
func (c Config) pipelineConfig(p Pipeline) Config {
	return Config{Postgres: p.Postgres, Sink: p.Sink, Envelope: p.Envelope, Relay: p.Relay, HTTP: c.HTTP, Log: c.Log, Config: c.Config}
}

// pipelineName is what a pipeline's name may be: it is a metric label and
// a path segment of the management API.
var pipelineName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// resolvePipelines lays each entry's sections over a copy of the top-level
// ones (file and environment applied, secret files not yet read) and reads
// the entry's secret files. A secret the entry sets, as the key or its
// _file, replaces both of the inherited pair. Decoding errors are left out
// unless checked: checkDocument has reported them by their path.
func (c *Config) resolvePipelines(fromEnv map[string]bool, checked bool) error {
	var errs []error
	for i := range c.Pipelines {
		p := &c.Pipelines[i]
		where := fmt.Sprintf("pipelines[%d]", i)
		if p.Name != "" {
			where = fmt.Sprintf("pipelines[%d] (%s)", i, p.Name)
		}
		base := Config{Postgres: c.Postgres, Sink: c.Sink.clone(), Envelope: c.Envelope, Relay: c.Relay}
		sections := map[string]*yaml.Node{"postgres": &p.raw.Postgres, "sink": &p.raw.Sink, "envelope": &p.raw.Envelope, "relay": &p.raw.Relay}
		walkSecrets(reflect.ValueOf(&base).Elem(), "", func(key, _ string, val, file reflect.Value) {
			if setIn(sections, key) || setIn(sections, key+"_file") {
				val.SetString("")
				if file.IsValid() {
					file.SetString("")
				}
			}
		})
		for _, s := range []struct {
			node *yaml.Node
			dst  any
		}{{&p.raw.Postgres, &base.Postgres}, {&p.raw.Sink, &base.Sink}, {&p.raw.Envelope, &base.Envelope}, {&p.raw.Relay, &base.Relay}} {
			if s.node.Kind == 0 {
				continue
			}
			if err := s.node.Decode(s.dst); err != nil && checked {
				errs = append(errs, fmt.Errorf("%s: %w", where, err))
			}
		}
		for _, e := range Problems(base.readSecretFiles(fromEnv)) {
			errs = append(errs, fmt.Errorf("%s: %w", where, e))
		}
		p.Postgres, p.Sink, p.Envelope, p.Relay = base.Postgres, base.Sink, base.Envelope, base.Relay
	}
	return errors.Join(errs...)
}

// setIn reports whether the key at path (postgres.url) is set in the
// entry's sections.
func setIn(sections map[string]*yaml.Node, path string) bool {
	parts := strings.Split(path, ".")
	n, ok := sections[parts[0]]
	if !ok {
		return false
	}
	for _, part := range parts[1:] {
		if n.Kind == yaml.AliasNode {
			n = n.Alias
		}
		if n.Kind != yaml.MappingNode {
			return false
		}
		var next *yaml.Node
		for j := 0; j+1 < len(n.Content); j += 2 {
			if n.Content[j].Value == part {
				next = n.Content[j+1]
			}
		}
		if next == nil {
			return false
		}
		n = next
	}
	return true
}

// validatePipelines checks each pipeline as a configuration of its own,
// its name, and that no two pipelines read the same slot of the same
// database.
func (c *Config) validatePipelines() []error {
	var errs []error
	seen := map[string]int{}
	slots := map[string]int{}
	for i, p := range c.Pipelines {
		where := fmt.Sprintf("pipelines[%d] (%s)", i, p.Name)
		switch j, dup := seen[p.Name]; {
		case p.Name == "":
			where = fmt.Sprintf("pipelines[%d]", i)
			errs = append(errs, fmt.Errorf("%s: name is required", where))
		case !pipelineName.MatchString(p.Name):
			errs = append(errs, fmt.Errorf("%s: name must be lower-case letters, digits, - and _ (at most 63, starting with a letter or digit)", where))
		case dup:
			errs = append(errs, fmt.Errorf("%s: name is also pipelines[%d]'s; each pipeline needs its own", where, j))
		default:
			seen[p.Name] = i
		}
		pc := c.pipelineConfig(p)
		for _, e := range pc.validatePipeline() {
			errs = append(errs, fmt.Errorf("%s: %w", where, e))
		}
		key := server(p.Postgres.URL) + "\x00" + p.Postgres.Slot
		if j, dup := slots[key]; dup && p.Postgres.URL != "" {
			errs = append(errs, fmt.Errorf("%s: postgres.slot %s on the same server is also pipelines[%d]'s; a slot's name is the server's, not the database's: give each pipeline its own", where, p.Postgres.Slot, j))
		} else {
			slots[key] = i
		}
	}
	return errs
}

// server is the host and port of a PostgreSQL URL, or the whole setting
// when it is not a URL: the scope of a slot's name.
func server(setting string) string {
	u, err := url.Parse(setting)
	if err != nil || u.Host == "" {
		return setting
	}
	return u.Host
}

// redactPipelines hides the secrets of every pipeline of c, in place.
func (c *Config) redactPipelines() {
	ps := make([]Pipeline, len(c.Pipelines))
	for i, p := range c.Pipelines {
		r := Config{Postgres: p.Postgres, Sink: p.Sink, Envelope: p.Envelope, Relay: p.Relay}.Redacted()
		p.Postgres, p.Sink, p.Envelope, p.Relay = r.Postgres, r.Sink, r.Envelope, r.Relay
		ps[i] = p
	}
	c.Pipelines = ps
}
