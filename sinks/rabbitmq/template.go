package rabbitmq

import (
	"sync"
	"sync/atomic"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/route"
)

// wordEscape holds the bytes percent-encoded in values because they have a
// meaning in topic routing: '.' separates words, '*' and '#' are wildcards
// in bindings, and '%' itself so that the encoding can be reversed. A value
// therefore stays inside the word the template puts it in.
var wordEscape = route.EscapeFunc(func(c byte) bool {
	return c == '.' || c == '*' || c == '#' || c == '%'
})

// template is a parsed routing key template.
type template struct {
	route.Template
}

// parseTemplate parses s; see [route.Parse].
func parseTemplate(s string) (template, error) {
	t, err := route.Parse(s)
	return template{t}, err
}

// render substitutes m's values into t, each escaped with wordEscape.
func (t template) render(m *relay.Message) string {
	return t.Render(m, wordEscape)
}

// maxCachedKeys bounds the routing keys a sink remembers. A template
// keyed by a value with many values (an aggregate id) fills it quickly;
// its keys are then rendered anew for each message, as without the cache.
const maxCachedKeys = 256

// destinations remembers the routing keys rendered so far, each with its
// destination (exchange "/" key), so that a key seen before is found
// without allocating either string. Lookups read an immutable map; adding
// a key copies it, which happens at most maxCachedKeys times.
type destinations struct {
	exchange string
	mu       sync.Mutex // serialises additions
	seen     atomic.Pointer[map[string]destination]
}

type destination struct{ key, dest string }

// render renders t for m and returns the routing key and the destination.
func (d *destinations) render(t template, m *relay.Message) (key, dest string) {
	var buf [128]byte
	b := t.Append(buf[:0], m, wordEscape)
	if seen := d.seen.Load(); seen != nil {
		if v, ok := (*seen)[string(b)]; ok {
			return v.key, v.dest
		}
	}
	key = string(b)
	dest = d.exchange + "/" + key
	d.mu.Lock()
	defer d.mu.Unlock()
	var old map[string]destination
	if p := d.seen.Load(); p != nil {
		old = *p
	}
	if _, ok := old[key]; !ok && len(old) < maxCachedKeys {
		next := make(map[string]destination, len(old)+1)
		for k, v := range old {
			next[k] = v
		}
		next[key] = destination{key, dest}
		d.seen.Store(&next)
	}
	return key, dest
}
