package doccheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/kafka"
	"github.com/outboxrelay/outboxrelay/sinks/route"
)

// guideAggregate is the aggregate type the consumer guide's Kafka consumer
// handles: its handler deposits into accounts.
const guideAggregate = "account"

var (
	// guideTopicRE finds the topic of the guide's kafka.Config.
	guideTopicRE = regexp.MustCompile(`Topics: \[\]string\{"([^"]*)"\}`)
	// exampleTopicRE finds the topic of inbox/kafka's example, a constant
	// there because that module cannot import the relay's.
	exampleTopicRE = regexp.MustCompile(`const accountTopic = "([^"]*)"`)
	// replaceRE finds the guide's go.mod replace lines to the clone.
	replaceRE = regexp.MustCompile(`(?m)^replace (\S+) => \.\./outboxrelay/(\S+)$`)
	// goDirectiveRE finds a go.mod's go line.
	goDirectiveRE = regexp.MustCompile(`(?m)^go \S+$`)
)

// TestConsumerGuideBuildsFromAClone: the consumer guide's Kafka program and
// inbox/kafka's example consume the topic the relay's Kafka sink publishes
// the guide's aggregate type to by default (they listened on Debezium's
// outbox.event.account, where the relay publishes nothing unless told to,
// and sat silent); and the guide's program builds as a service's own
// module would take the inbox modules before they are published: with the
// guide's require and replace lines pointing at this clone, offline
// (GOPROXY=off: the module cache has what the clone's inbox modules use).
func TestConsumerGuideBuildsFromAClone(t *testing.T) {
	tmpl, err := route.Parse(kafka.DefaultTopic)
	if err != nil {
		t.Fatal(err)
	}
	want := tmpl.Render(&relay.Message{AggregateType: guideAggregate}, nil)

	guide := strings.Join(lines(t, "docs/consumers.md"), "\n")
	program := codeBlock(t, guide, "```go\npackage main\n")
	if got := submatch(t, guideTopicRE, program, "docs/consumers.md's Kafka program"); got != want {
		t.Errorf("docs/consumers.md's Kafka program consumes %q; the relay publishes aggregate type %s to %q (sink.kafka.topic default %s)", got, guideAggregate, want, kafka.DefaultTopic)
	}
	example := strings.Join(lines(t, "inbox/kafka/example_test.go"), "\n")
	if got := submatch(t, exampleTopicRE, example, "inbox/kafka/example_test.go"); got != want {
		t.Errorf("inbox/kafka/example_test.go consumes %q; the relay publishes aggregate type %s to %q", got, guideAggregate, want)
	}
	if t.Failed() {
		return
	}

	gomod := codeBlock(t, guide, "```\nrequire github.com/outboxrelay/outboxrelay/inbox/kafka ")
	buildFromClone(t, program, gomod)
}

// buildFromClone builds program in a module of its own whose go.mod holds
// the guide's lines (gomod), its ../outboxrelay the clone.
func buildFromClone(t *testing.T, program, gomod string) {
	t.Helper()
	clone, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	replaces := replaceRE.FindAllStringSubmatch(gomod, -1)
	if len(replaces) != 2 {
		t.Fatalf("the guide's go.mod lines hold %d replace lines to ../outboxrelay, want 2 (inbox/kafka and the inbox core):\n%s", len(replaces), gomod)
	}
	for _, r := range replaces {
		if r[1] != modulePath+"/"+r[2] {
			t.Errorf("the guide replaces %s with ../outboxrelay/%s, not that module's directory", r[1], r[2])
		}
	}
	kafkaMod := strings.Join(lines(t, "inbox/kafka/go.mod"), "\n")
	goLine := goDirectiveRE.FindString(kafkaMod)
	if goLine == "" {
		t.Fatal("inbox/kafka/go.mod has no go line")
	}

	dir := t.TempDir()
	mod := "module example.com/billing\n\n" + goLine + "\n\n" + strings.ReplaceAll(gomod, "../outboxrelay/", filepath.ToSlash(clone)+"/")
	// The clone's go.sum files hold every checksum the module needs, so
	// that nothing is asked of the checksum database.
	var sums []string
	for _, f := range []string{"inbox/kafka/go.sum", "inbox/go.sum"} {
		sums = append(sums, lines(t, f)...)
	}
	for name, text := range map[string]string{"go.mod": mod, "go.sum": strings.Join(sums, "\n"), "main.go": program} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off", "GOTOOLCHAIN=local")
	for _, args := range [][]string{{"mod", "tidy"}, {"build", "-o", filepath.Join(dir, "billing"), "."}} {
		cmd := exec.Command("go", args...)
		cmd.Dir, cmd.Env = dir, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s in a module with the guide's go.mod lines: %v\n%s\ngo.mod:\n%s\n(module lookup disabled means the module cache lacks one: run go mod download in inbox/kafka)", strings.Join(args, " "), err, out, mod)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "billing")); err != nil {
		t.Fatalf("go build wrote no binary: %v", err)
	}
}

// codeBlock returns the body of the fenced block of page that starts with
// start (its fence line and first line), failing t when there is none.
func codeBlock(t *testing.T, page, start string) string {
	t.Helper()
	i := strings.Index(page, start)
	if i < 0 {
		t.Fatalf("no code block starting %q", start)
	}
	body := page[i+strings.Index(start, "\n")+1:]
	end := strings.Index(body, "\n```")
	if end < 0 {
		t.Fatalf("the code block starting %q is not closed", start)
	}
	return body[:end+1]
}

func submatch(t *testing.T, re *regexp.Regexp, text, where string) string {
	t.Helper()
	m := re.FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("%s: nothing matches %s", where, re)
	}
	return m[1]
}
