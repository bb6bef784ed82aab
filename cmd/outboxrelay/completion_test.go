package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// complete runs the bash completion function on words (the last one is
// being completed) in dir and returns what it offers.
func complete(t *testing.T, bash, script, dir string, words ...string) []string {
	t.Helper()
	var quoted []string
	for _, w := range words {
		quoted = append(quoted, "'"+w+"'")
	}
	cmd := exec.Command(bash, "--norc", "--noprofile", "-c", script+"\nCOMP_WORDS=(outboxrelay "+strings.Join(quoted, " ")+
		")\nCOMP_CWORD=$((${#COMP_WORDS[@]} - 1))\n_outboxrelay\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bash completion of %q: %v\n%s", words, err, out)
	}
	return strings.Fields(string(out))
}

// TestCompletionFollowsCommandTable: every command of the table is offered
// by each shell's script, bash offers every flag a command's --help lists,
// and a flag with a fixed list of values completes those values, not file
// names.
func TestCompletionFollowsCommandTable(t *testing.T) {
	scripts := map[string]string{}
	for _, sh := range shells {
		var out, errOut bytes.Buffer
		if code := runMain([]string{"completion", sh}, &out, &errOut); code != exitOK {
			t.Fatalf("completion %s: exit %d: %s", sh, code, errOut.String())
		}
		scripts[sh] = out.String()
	}
	names := commandNames()
	for _, want := range []string{"verify", "replay", "recover", "schema", "status", "dlq"} {
		if !slices.Contains(names, want) {
			t.Fatalf("the command table lacks %s: %v", want, names)
		}
	}
	for _, name := range names {
		word := regexp.MustCompile(`(^|[^a-z-])` + name + `([^a-z-]|$)`)
		if !word.MatchString(scripts["zsh"]) || !word.MatchString(scripts["fish"]) {
			t.Errorf("the zsh or fish script does not offer %s", name)
		}
	}
	if !strings.Contains(scripts["fish"], "-a '"+strings.Join(names, " ")+"'") {
		t.Errorf("fish does not offer the commands %v:\n%s", names, scripts["fish"])
	}

	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal("bash is not installed: it is needed to run the bash completion")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "relay.yaml"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := complete(t, bash, scripts["bash"], dir, ""); !slices.Equal(got, names) {
		t.Errorf("bash offers the commands %v, the table has %v", got, names)
	}
	enumerated := 0
	for _, n := range completionTree() {
		if len(n.flags) > 0 {
			got := complete(t, bash, scripts["bash"], dir, append(n.path, "-")...)
			for _, f := range n.flags {
				if !slices.Contains(got, f.name) {
					t.Errorf("bash does not offer %s after %q (offers %v)", f.name, n.path, got)
				}
			}
		}
		if len(n.words) > 0 {
			if got := complete(t, bash, scripts["bash"], dir, append(n.path, "")...); !slices.Equal(got, n.words) {
				t.Errorf("bash offers %v after %q, want %v", got, n.path, n.words)
			}
		}
		for _, f := range n.flags {
			if len(f.values) == 0 {
				continue
			}
			enumerated++
			if got := complete(t, bash, scripts["bash"], dir, append(n.path, f.name, "")...); !slices.Equal(got, f.values) {
				t.Errorf("bash offers %v after %q %s, want its values %v", got, n.path, f.name, f.values)
			}
			if !strings.Contains(scripts["fish"], "-x -a '"+strings.Join(f.values, " ")+"'") {
				t.Errorf("fish does not complete the values %v of %q %s", f.values, n.path, f.name)
			}
		}
	}
	if got := complete(t, bash, scripts["bash"], dir, "status", "-o", ""); !slices.Equal(got, []string{"json", "wide"}) {
		t.Errorf("status -o completes %v, want json wide", got)
	}
	if enumerated == 0 {
		t.Error("no flag has a fixed list of values; status -o has json|wide")
	}
	if got := complete(t, bash, scripts["bash"], dir, "inbox", "dlq", ""); !slices.Equal(got, []string{"list", "show", "replay", "discard"}) {
		t.Errorf("inbox dlq completes %v, want its subcommands", got)
	}
	if got := complete(t, bash, scripts["bash"], dir, "inbox", "dlq", "discard", "--r"); !slices.Equal(got, []string{"--reason"}) {
		t.Errorf("inbox dlq discard --r completes %v, want --reason", got)
	}
	if got := complete(t, bash, scripts["bash"], dir, "run", "--config", ""); !slices.Equal(got, []string{"relay.yaml"}) {
		t.Errorf("run --config completes %v, want the file relay.yaml", got)
	}
}
