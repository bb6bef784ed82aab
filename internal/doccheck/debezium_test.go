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

// routerOptionRows returns the rows of the option table in
// docs/debezium.md: the option (the backticked names of the first cell
// before any parenthesis, joined by a space) and what outboxrelay has.
func routerOptionRows(t *testing.T) map[string]string {
	t.Helper()
	const header = "| Outbox Event Router option | outboxrelay |"
	text := lines(t, "docs/debezium.md")
	i := slices.Index(text, header)
	if i < 0 {
		t.Fatalf("docs/debezium.md has no table %q", header)
	}
	rows := map[string]string{}
	for n, l := range text[i+2:] {
		if !strings.HasPrefix(l, "|") {
			break
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		if len(cells) != 2 {
			t.Errorf("docs/debezium.md:%d: %d cells, want 2: %s", i+3+n, len(cells), l)
			continue
		}
		first, _, _ := strings.Cut(cells[0], "(")
		var names []string
		for _, m := range backtickRE.FindAllStringSubmatch(first, -1) {
			names = append(names, m[1])
		}
		option := strings.Join(names, " ")
		if _, dup := rows[option]; dup {
			t.Errorf("docs/debezium.md:%d: option %q has two rows", i+3+n, option)
		}
		rows[option] = strings.TrimSpace(cells[1])
	}
	return rows
}

// TestDebeziumRouterOptionsMapped fails when the table "The router's
// options, one by one" in docs/debezium.md lacks an option of Debezium's
// outbox event router, leaves its outboxrelay cell empty, or names an
// option the router does not have (a typo, or a list to update); and when
// the README's Routing section stops linking to it.
func TestDebeziumRouterOptionsMapped(t *testing.T) {
	rows := routerOptionRows(t)
	for _, o := range debeziumRouterOptions {
		switch what, ok := rows[o]; {
		case !ok:
			t.Errorf("docs/debezium.md: the router's option %q has no row", o)
		case what == "":
			t.Errorf("docs/debezium.md: the router's option %q says nothing of outboxrelay", o)
		}
	}
	for o := range rows {
		if !slices.Contains(debeziumRouterOptions, o) {
			t.Errorf("docs/debezium.md: %q is no option of the router this test knows; fix the row, or add the option to debeziumRouterOptions with its source", o)
		}
	}

	readme := strings.Join(lines(t, "README.md"), "\n")
	i := strings.Index(readme, "\n## Routing\n")
	if i < 0 {
		t.Fatal("README.md has no Routing section")
	}
	section := readme[i+1:]
	if j := strings.Index(section[1:], "\n## "); j >= 0 {
		section = section[:j+1]
	}
	const heading = "### Coming from Debezium's outbox event router\n"
	j := strings.Index(section, heading)
	if j < 0 {
		t.Fatalf("the README's Routing section has no %q", strings.TrimSpace(heading))
	}
	if !strings.Contains(section[j:], "](docs/debezium.md#the-routers-options-one-by-one)") {
		t.Error("the README's \"Coming from Debezium's outbox event router\" does not link to the option table, docs/debezium.md#the-routers-options-one-by-one")
	}
}
