// Package webhook is the outboxrelay sink that POSTs every relayed message
// to an HTTP endpoint, signed as the Standard Webhooks specification says
// (standardwebhooks.com), built on net/http.
//
// A [Sink] sends one request per message:
//
//   - URL: rendered from [Config.URL]; placeholders ({aggregate_type},
//     {event_type}, {table}) may stand only in the path and the query, and
//     their values are percent-encoded, so that a row can never change the
//     scheme, host or port the request goes to;
//   - body: the envelope as the relay built it, unchanged, with its media
//     type as Content-Type;
//   - headers: webhook-id (the message_id), webhook-timestamp (Unix
//     seconds of this attempt) and webhook-signature ("v1," and the base64
//     HMAC-SHA256 of id.timestamp.body under each configured secret,
//     space-separated); then the relay's headers as every sink carries them
//     (message_id, event_type, aggregate_id, aggregate_type, traceparent,
//     content-type, ce- attributes in cloudevents-binary format, the row's
//     headers), names as written;
//   - auth: basic auth, a bearer token, or a client certificate.
//
// Outcomes: a 2xx answer delivers the message. 5xx, 408 and 429 answers,
// timeouts and connection errors are retryable (the relay retries them
// with backoff); a Retry-After on a 429 or 503 answer holds every request
// of the sink until the time it names, at most [Config.MaxRetryAfter].
// Any other answer (other 4xx, and 3xx unless [Config.FollowRedirects])
// is a relay.Permanent error carrying the status and the first 512 bytes of
// the response, which the relay dead-letters. A row whose header cannot be
// sent over HTTP (not valid UTF-8, an invalid name or value, a name the sink or HTTP owns
// such as webhook-signature, Authorization or Host) or whose rendered URL
// would leave its place (a "." or ".." path segment) is refused
// permanently too, with the reason.
//
// Per-aggregate order: the sink sends the next message of an aggregate
// only once the one before it has been answered, and a retryable failure
// fails the messages of its aggregate queued behind it, so none overtakes
// it. Different aggregates are sent concurrently, over at most
// [Config.MaxConnsPerHost] connections.
//
// Delivery is at-least-once: a request that timed out may have been
// processed; the receiver dedupes on webhook-id.
//
// Tests run against net/http/httptest servers on loopback TCP.
package webhook
