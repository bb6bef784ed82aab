package main

import (
	"bytes"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
)

// shells are the shells completion writes a script for.
var shells = []string{"bash", "zsh", "fish"}

// The scripts are generated from the command table (commands) and from
// what each command's --help prints, the same source as the usage and the
// help: a command, subcommand or flag cannot be in one and missing from
// the other.

// nestedSubcommands are the subcommands of a subcommand ("inbox dlq"),
// each with flags of its own.
var nestedSubcommands = map[string][]string{"inbox dlq": inboxDLQCommands}

// compNode is what completion offers after a command, or a command and its
// subcommand: the words that may follow it and its flags.
type compNode struct {
	path  []string
	words []string
	flags []compFlag
}

// compFlag is a flag as --help prints it ("  --config string", "  -o json|wide").
type compFlag struct {
	name   string   // with its dashes
	value  bool     // takes a value
	values []string // the values it accepts, when --help names a fixed list (a|b)
}

// flagLine matches the line that names a flag in newFlags' usage.
var flagLine = regexp.MustCompile(`(?m)^  (--?[a-z0-9][a-z0-9-]*)(?: (\S+))?$`)

// helpFlags returns the flags `outboxrelay ARGS --help` lists.
func helpFlags(args ...string) []compFlag {
	var out bytes.Buffer
	if runMain(append(args, "--help"), &out, io.Discard) != exitOK {
		return nil
	}
	var flags []compFlag
	for _, m := range flagLine.FindAllStringSubmatch(out.String(), -1) {
		f := compFlag{name: m[1], value: m[2] != ""}
		if strings.Contains(m[2], "|") {
			f.values = strings.Split(m[2], "|")
		}
		flags = append(flags, f)
	}
	return flags
}

// completionTree returns a node per command and per subcommand, in the
// table's order.
func completionTree() []compNode {
	var nodes []compNode
	for _, c := range commands() {
		n := compNode{path: []string{c.name}, words: append(append([]string(nil), c.subcommands...), c.args...)}
		if c.name == "help" {
			n.words = commandNames()
		}
		if len(c.subcommands) == 0 {
			n.flags = helpFlags(c.name)
		}
		nodes = append(nodes, n)
		for _, sub := range c.subcommands {
			nested := nestedSubcommands[c.name+" "+sub]
			if len(nested) == 0 {
				nodes = append(nodes, compNode{path: []string{c.name, sub}, flags: helpFlags(c.name, sub)})
				continue
			}
			nodes = append(nodes, compNode{path: []string{c.name, sub}, words: nested})
			for _, n := range nested {
				nodes = append(nodes, compNode{path: []string{c.name, sub, n}, flags: helpFlags(c.name, sub, n)})
			}
		}
	}
	return nodes
}

func commandNames() []string {
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
	}
	return names
}

func flagNames(fs []compFlag) string {
	var names []string
	for _, f := range fs {
		names = append(names, f.name)
	}
	return strings.Join(names, " ")
}

func bashCompletion() string {
	var b strings.Builder
	fmt.Fprintf(&b, `# bash completion for outboxrelay: source <(outboxrelay completion bash)
_outboxrelay() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} path=${COMP_WORDS[1]} words= flags=
    COMPREPLY=()
    if [[ $COMP_CWORD -eq 1 ]]; then
        COMPREPLY=($(compgen -W "%s" -- "$cur"))
        return
    fi
`, strings.Join(commandNames(), " "))
	var withSubs []string
	for _, c := range commands() {
		if len(c.subcommands) > 0 {
			withSubs = append(withSubs, c.name)
		}
	}
	if len(withSubs) > 0 {
		fmt.Fprintf(&b, "    case $path in\n    %s) [[ $COMP_CWORD -gt 2 ]] && path=\"$path ${COMP_WORDS[2]}\" ;;\n    esac\n", strings.Join(withSubs, "|"))
	}
	var nested []string
	for k := range nestedSubcommands {
		nested = append(nested, fmt.Sprintf("%q", k))
	}
	if len(nested) > 0 {
		slices.Sort(nested)
		fmt.Fprintf(&b, "    case $path in\n    %s) [[ $COMP_CWORD -gt 3 ]] && path=\"$path ${COMP_WORDS[3]}\" ;;\n    esac\n", strings.Join(nested, "|"))
	}
	b.WriteString("    case $path in\n")
	for _, n := range completionTree() {
		fmt.Fprintf(&b, "    %q)\n", strings.Join(n.path, " "))
		if len(n.words) > 0 {
			fmt.Fprintf(&b, "        [[ $COMP_CWORD -eq %d ]] && words=%q\n", len(n.path)+1, strings.Join(n.words, " "))
		}
		if len(n.flags) > 0 {
			fmt.Fprintf(&b, "        flags=%q\n", flagNames(n.flags))
		}
		for _, f := range n.flags {
			if len(f.values) > 0 {
				fmt.Fprintf(&b, "        [[ $prev == %s ]] && words=%q\n", f.name, strings.Join(f.values, " "))
			}
		}
		b.WriteString("        ;;\n")
	}
	b.WriteString(`    esac
    if [[ -n $words ]]; then
        COMPREPLY=($(compgen -W "$words" -- "$cur"))
    elif [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$flags" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}
complete -F _outboxrelay outboxrelay
`)
	return b.String()
}

func zshCompletion() string {
	return "#compdef outboxrelay\n# zsh completion for outboxrelay: source <(outboxrelay completion zsh)\nautoload -U +X bashcompinit && bashcompinit\n" + bashCompletion()
}

func fishCompletion() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# fish completion for outboxrelay: outboxrelay completion fish | source\ncomplete -c outboxrelay -f\ncomplete -c outboxrelay -n __fish_use_subcommand -a '%s'\n",
		strings.Join(commandNames(), " "))
	for _, n := range completionTree() {
		cond := "__fish_seen_subcommand_from " + n.path[0]
		for _, w := range n.path[1:] {
			cond += "; and __fish_seen_subcommand_from " + w
		}
		if len(n.words) > 0 {
			fmt.Fprintf(&b, "complete -c outboxrelay -n '%s; and test (count (commandline -opc)) -eq %d' -a '%s'\n", cond, len(n.path), strings.Join(n.words, " "))
		}
		for _, f := range n.flags {
			opt := "-l " + strings.TrimPrefix(f.name, "--")
			if !strings.HasPrefix(f.name, "--") {
				opt = "-s " + strings.TrimPrefix(f.name, "-")
			}
			switch {
			case len(f.values) > 0:
				opt += fmt.Sprintf(" -x -a '%s'", strings.Join(f.values, " "))
			case f.value:
				opt += " -r -F"
			}
			fmt.Fprintf(&b, "complete -c outboxrelay -n '%s' %s\n", cond, opt)
		}
	}
	return b.String()
}

// cmdCompletion prints the shell completion script for bash, zsh or fish.
func cmdCompletion(args []string, stdout, stderr io.Writer) error {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help") {
		fmt.Fprint(stdout, "Usage:\n  outboxrelay completion bash|zsh|fish\n\nPrint the shell completion script:\n  source <(outboxrelay completion bash)    # bash, zsh: the same with zsh\n  outboxrelay completion fish | source\n")
		return nil
	}
	if len(args) != 1 {
		return usageErr("completion needs one shell: bash, zsh or fish")
	}
	script := map[string]func() string{"bash": bashCompletion, "zsh": zshCompletion, "fish": fishCompletion}[args[0]]
	if script == nil {
		return usageErr("completion: unknown shell %q; use bash, zsh or fish", args[0])
	}
	_, err := io.WriteString(stdout, script())
	return err
}
