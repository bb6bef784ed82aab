package app

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/outboxrelay/outboxrelay/internal/config"
	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/replay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/verify"
)

// maxMissingIDs bounds the missing ids a verify answer lists; the count
// is always whole.
const maxMissingIDs = 1000

// VerifyResult is what `verify` finds over a window, as the management
// API answers it.
type VerifyResult struct {
	Since time.Time  `json:"since"`
	Until *time.Time `json:"until"`
	// OK is true when no committed row of the window is missing.
	OK           bool  `json:"ok"`
	Committed    int64 `json:"committed"`
	Found        int64 `json:"found"`
	Missing      int64 `json:"missing"`
	Duplicates   int64 `json:"duplicates"`
	DeadLettered int64 `json:"dead_lettered"`
	Parked       int64 `json:"parked"`
	Filtered     int64 `json:"filtered"`
	BrokerIDs    int64 `json:"broker_ids"`
	// MissingIDs are the first maxMissingIDs missing ids, in creation
	// order; MissingIDsTruncated says there are more.
	MissingIDs          []string `json:"missing_ids"`
	MissingIDsTruncated bool     `json:"missing_ids_truncated"`
}

// errNotVerifiable is the error of a sink that cannot read its broker back.
var errNotVerifiable = errors.New("cannot be verified")

// VerifyWindow reconciles the outbox rows of cfg's tables that f selects
// with what cfg's sink's broker holds, as `outboxrelay verify` does, on
// connections of its own (a running pipeline is not disturbed). margin
// is how much earlier than f.Since the broker is read; queue is
// RabbitMQ's verification queue.
func VerifyWindow(ctx context.Context, cfg config.Config, f replay.Filter, margin time.Duration, queue string) (VerifyResult, error) {
	res := VerifyResult{Since: f.Since.UTC(), MissingIDs: []string{}}
	if !f.Until.IsZero() {
		u := f.Until.UTC()
		res.Until = &u
	}
	v, ok := cfg.Sink.Settings().(sinks.Verifiable)
	if !ok {
		return res, fmt.Errorf("sink.type %q %w: its sink does not read its broker back", cfg.Sink.Type, errNotVerifiable)
	}
	rd, dest, err := v.VerifyReader(sinks.VerifyOptions{Queue: queue})
	if err != nil {
		return res, fmt.Errorf("%w: %v", errNotVerifiable, err)
	}
	defer rd.Close()
	conn, err := Connect(ctx, cfg.Postgres.URL)
	if err != nil {
		return res, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var database string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&database); err != nil {
		return res, fmt.Errorf("query PostgreSQL: %w", err)
	}
	src := OutboxSource(cfg, database)
	rep, err := verify.Run(ctx, conn, rd, verify.Config{Source: src, Filter: f, Slot: cfg.Postgres.Slot, Destination: dest, Margin: margin},
		func(id string) error {
			if len(res.MissingIDs) < maxMissingIDs {
				res.MissingIDs = append(res.MissingIDs, id)
			} else {
				res.MissingIDsTruncated = true
			}
			return nil
		})
	if err != nil {
		return res, fmt.Errorf("verify: %w", err)
	}
	res.OK = rep.Missing == 0
	res.Committed, res.Found, res.Missing, res.Duplicates = rep.Committed, rep.Found, rep.Missing, rep.Duplicates
	res.DeadLettered, res.Parked, res.Filtered, res.BrokerIDs = rep.DeadLettered, rep.Parked, rep.Filtered, rep.BrokerIDs
	return res, nil
}

// verifyPipeline runs verify over ?since= (required) to ?until= (default
// now), each an RFC 3339 time or a duration ago, on the pipeline's
// database and broker.
func (p *Process) verifyPipeline(_ http.ResponseWriter, r *http.Request) (int, any) {
	u := p.unit(r.PathValue("name"))
	if u == nil {
		return http.StatusNotFound, apiError(fmt.Sprintf("no pipeline is named %q", r.PathValue("name")))
	}
	q := r.URL.Query()
	now := time.Now()
	var f replay.Filter
	var err error
	if f.Since, err = windowTime("since", q.Get("since"), now); err != nil || f.Since.IsZero() {
		return http.StatusBadRequest, apiError("since is required: an RFC 3339 time (2026-11-29T08:00:00Z) or a duration ago (15m)")
	}
	if f.Until, err = windowTime("until", q.Get("until"), now); err != nil {
		return http.StatusBadRequest, apiError(err.Error())
	}
	if !f.Until.IsZero() && !f.Until.After(f.Since) {
		return http.StatusBadRequest, apiError("until must be after since")
	}
	f.AggregateTypes = q["aggregate_type"]
	margin := time.Minute
	if m := q.Get("margin"); m != "" {
		if margin, err = time.ParseDuration(m); err != nil || margin < 0 {
			return http.StatusBadRequest, apiError(fmt.Sprintf("margin %q is not a duration such as 1m", m))
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Minute)
	defer cancel()
	res, err := VerifyWindow(ctx, u.Config, f, margin, q.Get("rabbitmq_queue"))
	switch {
	case errors.Is(err, errNotVerifiable):
		return http.StatusUnprocessableEntity, apiError(redact.Text(err.Error()))
	case err != nil:
		return http.StatusBadGateway, apiError(redact.Text(err.Error()))
	}
	return http.StatusOK, res
}

// windowTime reads an RFC 3339 time or a duration before now; "" is zero.
func windowTime(name, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s %q is neither an RFC 3339 time (2026-11-29T08:00:00Z) nor a duration ago (15m)", name, v)
	}
	return t, nil
}
