package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/outboxrelay/outboxrelay/internal/config"
)

// loadConfig loads the configuration at path with the environment's
// overrides. It warns on stderr about every OUTBOXRELAY_ variable that names
// no key (a typo would otherwise be ignored without a word), and reports
// every problem of an invalid configuration, one per line.
func loadConfig(path string, stderr io.Writer) (config.Config, error) {
	for _, w := range config.UnknownEnv(os.Environ()) {
		fmt.Fprintln(stderr, "outboxrelay: warning:", w)
	}
	cfg, err := config.Load(path, os.LookupEnv)
	if err != nil {
		return cfg, invalidConfig(config.Problems(err)...)
	}
	return cfg, nil
}

// invalidConfig is the exit-2 error of an invalid configuration.
func invalidConfig(problems ...error) error {
	return &exitError{code: exitUsage, err: &problemList{what: "invalid configuration", problems: problems}}
}

// problemList is a failure with several independent causes: runMain prints
// each on a line of its own.
type problemList struct {
	what     string
	problems []error
}

func (p *problemList) Error() string {
	var parts []string
	for _, e := range p.problems {
		parts = append(parts, e.Error())
	}
	return p.what + ": " + strings.Join(parts, "; ")
}

func (p *problemList) Unwrap() []error { return p.problems }

// lines is what runMain prints for p: the problem alone, or a heading and
// one indented line per problem.
func (p *problemList) lines() []string {
	if len(p.problems) == 1 {
		return []string{p.what + ": " + oneLine(p.problems[0].Error())}
	}
	out := []string{fmt.Sprintf("%s, %d problems:", p.what, len(p.problems))}
	for _, e := range p.problems {
		out = append(out, "  "+oneLine(e.Error()))
	}
	return out
}
