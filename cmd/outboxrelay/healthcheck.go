package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// cmdHealthcheck probes the relay's own HTTP endpoint, for container
// HEALTHCHECKs in images that have no curl: exit 0 on 200, 1 otherwise.
func cmdHealthcheck(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("healthcheck", "healthcheck [--url URL]",
		"Exit 0 when the relay's /healthz answers 200, 1 otherwise (for a container HEALTHCHECK).")
	url := fs.String("url", "http://127.0.0.1:9187/healthz", "URL that must answer 200")
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for the answer")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, *url, nil)
	if err != nil {
		return usageErr("healthcheck: %v", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return &exitError{code: exitUnhealthy, err: fmt.Errorf("healthcheck: %v", err)}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return &exitError{code: exitUnhealthy, err: fmt.Errorf("healthcheck: %s answered %s", *url, resp.Status)}
	}
	fmt.Fprintln(stdout, "ok")
	return nil
}
