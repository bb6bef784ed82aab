package doccheck

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// debeziumRouterOptions are the options of Debezium's outbox event router
// (io.debezium.transforms.outbox.EventRouter). The list comes from the
// Debezium repository, read on 2026-12-04: CONFIG_FIELDS of
// debezium-core/src/main/java/io/debezium/transforms/outbox/EventRouterConfigDefinition.java
// (each placement of table.fields.additional.placement is a value of its
// AdditionalFieldPlacement enum), the tracing options of
// io.debezium.transforms.tracing.ActivateTracingSpan, which the router's
// configuration groups under Tracing, and the "Configuration options" table
// of documentation/modules/ROOT/pages/transformations/outbox-event-router.adoc.
// The last two are names earlier versions of the same file defined
// (debezium.op.invalid.behavior was renamed table.op.invalid.behavior;
// table.field.event.payload.id was replaced by table.field.event.key),
// which configurations being migrated may still hold.
var debeziumRouterOptions = []string{
	"table.field.event.id",
	"table.field.event.key",
	"table.field.event.type",
	"table.field.event.timestamp",
	"table.field.event.payload",
	"table.fields.additional.placement header",
	"table.fields.additional.placement envelope",
	"table.fields.additional.placement partition",
	"table.fields.additional.error.on.missing",
	"table.field.event.schema.version",
	"table.op.invalid.behavior",
	"table.expand.json.payload",
	"table.json.payload.null.behavior",
	"route.by.field",
	"route.topic.regex",
	"route.topic.replacement",
	"route.tombstone.on.empty.payload",
	"tracing.span.context.field",
	"tracing.operation.name",
	"tracing.with.context.field.only",
	// Older names.
	"debezium.op.invalid.behavior",
	"table.field.event.payload.id",
}

var backtickRE = regexp.MustCompile("`([^`]+)`")

// routingSection returns the lines of the README's Routing section.
func routingSection(t *testing.T) []string {
	t.Helper()
	text := lines(t, "README.md")
	i := slices.Index(text, "## Routing")
	if i < 0 {
		t.Fatal("README.md has no Routing section")
	}
	section := text[i:]
	for j, l := range section[1:] {
		if strings.HasPrefix(l, "## ") {
			section = section[:j+1]
			break
		}
	}
	return section
}

// routerOptionRows returns the rows of the option table under "Coming
// from Debezium's outbox event router" in the README's Routing section:
// the option (the backticked names of the first cell before any
// parenthesis, joined by a space) and what outboxrelay has.
func routerOptionRows(t *testing.T) map[string]string {
	t.Helper()
	section := routingSection(t)
	h := slices.Index(section, "### Coming from Debezium's outbox event router")
	if h < 0 {
		t.Fatal("the README's Routing section has no \"Coming from Debezium's outbox event router\"")
	}
	const header = "| Outbox Event Router option | outboxrelay |"
	text := section[h:]
	i := slices.Index(text, header)
	if i < 0 {
		t.Fatalf("the README's \"Coming from Debezium's outbox event router\" has no table %q", header)
	}
	rows := map[string]string{}
	for n, l := range text[i+2:] {
		if !strings.HasPrefix(l, "|") {
			break
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		if len(cells) != 2 {
			t.Errorf("README.md, option table row %d: %d cells, want 2: %s", n+1, len(cells), l)
			continue
		}
		first, _, _ := strings.Cut(cells[0], "(")
		var names []string
		for _, m := range backtickRE.FindAllStringSubmatch(first, -1) {
			names = append(names, m[1])
		}
		option := strings.Join(names, " ")
		if _, dup := rows[option]; dup {
			t.Errorf("README.md, option table row %d: option %q has two rows", n+1, option)
		}
		rows[option] = strings.TrimSpace(cells[1])
	}
	return rows
}

// TestDebeziumRouterOptionsMapped fails when the table under "Coming from
// Debezium's outbox event router" in the README's Routing section lacks
// an option of Debezium's outbox event router, leaves its outboxrelay
// cell empty, or names an option the router does not have (a typo, or a
// list to update).
func TestDebeziumRouterOptionsMapped(t *testing.T) {
	rows := routerOptionRows(t)
	for _, o := range debeziumRouterOptions {
		switch what, ok := rows[o]; {
		case !ok:
			t.Errorf("README.md: the router's option %q has no row", o)
		case what == "":
			t.Errorf("README.md: the router's option %q says nothing of outboxrelay", o)
		}
	}
	for o := range rows {
		if !slices.Contains(debeziumRouterOptions, o) {
			t.Errorf("README.md: %q is no option of the router this test knows; fix the row, or add the option to debeziumRouterOptions with its source", o)
		}
	}
}
