package webhook

import (
	"fmt"
	"strings"
	"testing"

	"github.com/outboxrelay/outboxrelay/relay"
)

func TestURLTemplateErrors(t *testing.T) {
	for _, c := range []struct{ url, want string }{
		{"", "the URL is empty"},
		{"https://{aggregate_type}.example.com/hook", "placeholder in its scheme or host"},
		{"https://hooks.example.com:{table}/hook", "placeholder in its scheme or host"},
		{"https://u:{event_type}@hooks.example.com/hook", "placeholder in its scheme or host"},
		{"{aggregate_type}://hooks.example.com/", "placeholder in its scheme or host"},
		{"https://hooks.example.com/{aggregatetype}", "unknown placeholder {aggregatetype}"},
		{"https://hooks.example.com/{aggregate_type", "unclosed '{'"},
		{"ftp://hooks.example.com/", `scheme "ftp"`},
		{"hooks.example.com/hook", "no scheme"},
		{"https:///hook", "no host"},
		{"https://hooks.example.com/hook#{event_type}", "fragment"},
	} {
		_, err := parseURL(c.url)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseURL(%q) = %v, want an error with %q", c.url, err, c.want)
		}
	}
}

// A row's values stay inside their path segment or query value: they never
// change the host, add segments or parameters, or climb up the path.
func TestURLRenderContained(t *testing.T) {
	ep, err := parseURL("https://hooks.example.com/in/{aggregate_type}?type={event_type}")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		typ, event, want string
	}{
		{"order", "order.created", "https://hooks.example.com/in/order?type=order.created"},
		{"a/b", "x&admin=1", "https://hooks.example.com/in/a%2Fb?type=x%26admin%3D1"},
		{"@evil.example:80", "#frag", "https://hooks.example.com/in/%40evil.example%3A80?type=%23frag"},
		{"../../admin", "Zoë", "https://hooks.example.com/in/..%2F..%2Fadmin?type=Zo%C3%AB"},
	} {
		u, err := ep.render(&relay.Message{AggregateType: c.typ, EventType: c.event})
		if err != nil {
			t.Errorf("render(%q, %q): %v", c.typ, c.event, err)
			continue
		}
		if u.String() != c.want || u.Host != "hooks.example.com" {
			t.Errorf("render(%q, %q) = %s, want %s", c.typ, c.event, u, c.want)
		}
	}
	for _, typ := range []string{"..", ".", "caf\xe9"} {
		if u, err := ep.render(&relay.Message{AggregateType: typ}); err == nil {
			t.Errorf("render(%q) = %s, want an error for the dot segment or the invalid UTF-8", typ, u)
		}
	}
}

func TestStaticDestinations(t *testing.T) {
	for url, want := range map[string]string{
		"https://relay:pw@hooks.example.com/in?token=abc": "[https://hooks.example.com/in]",
		"https://hooks.example.com/in/{aggregate_type}":   "[]",
		"https://{aggregate_type}.example.com/":           "[]",
	} {
		if got := fmt.Sprint((&Config{URL: url}).StaticDestinations()); got != want {
			t.Errorf("StaticDestinations(%q) = %s, want %s", url, got, want)
		}
	}
}
