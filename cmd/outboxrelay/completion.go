package main

import (
	"fmt"
	"io"
	"strings"
)

// commands are the top-level commands, for completion.
var commands = []string{"migrate", "run", "status", "dlq", "maintain", "healthcheck", "completion", "version", "help"}

// The scripts ask the binary for each command's flags (`COMMAND --help`
// lists them, one "  --name" line each), so completion follows the flags
// the installed binary really has instead of a copy that can go stale.
const bashCompletion = `# bash completion for outboxrelay: source <(outboxrelay completion bash)
_outboxrelay() {
    local cur=${COMP_WORDS[COMP_CWORD]} cmd=${COMP_WORDS[1]} words
    COMPREPLY=()
    if [[ $COMP_CWORD -eq 1 ]]; then
        words="%[1]s"
    elif [[ $cmd == dlq && $COMP_CWORD -eq 2 ]]; then
        words="list show replay purge"
    elif [[ $cmd == completion && $COMP_CWORD -eq 2 ]]; then
        words="bash zsh fish"
    elif [[ $cur == -* ]]; then
        local sub=
        [[ $cmd == dlq ]] && sub=${COMP_WORDS[2]}
        words=$("${COMP_WORDS[0]}" $cmd $sub --help 2>/dev/null | sed -n 's/^  \(--[a-z0-9-]*\).*/\1/p')
    else
        COMPREPLY=($(compgen -f -- "$cur"))
        return
    fi
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -F _outboxrelay outboxrelay
`

const zshCompletion = `#compdef outboxrelay
# zsh completion for outboxrelay: source <(outboxrelay completion zsh)
autoload -U +X bashcompinit && bashcompinit
` + bashCompletion

const fishCompletion = `# fish completion for outboxrelay: outboxrelay completion fish | source
function __outboxrelay_flags
    set -l tokens (commandline -opc)
    set -l sub
    if test (count $tokens) -ge 3; and test $tokens[2] = dlq
        set sub $tokens[3]
    end
    $tokens[1] $tokens[2] $sub --help 2>/dev/null | string replace -rf '^  (--[a-z0-9-]+).*' '$1'
end
complete -c outboxrelay -f
complete -c outboxrelay -n __fish_use_subcommand -a '%[1]s'
complete -c outboxrelay -n '__fish_seen_subcommand_from dlq; and test (count (commandline -opc)) -eq 2' -a 'list show replay purge'
complete -c outboxrelay -n '__fish_seen_subcommand_from completion' -a 'bash zsh fish'
complete -c outboxrelay -n 'not __fish_use_subcommand; and string match -q -- "-*" (commandline -ct)' -a '(__outboxrelay_flags)'
`

// cmdCompletion prints the shell completion script for bash, zsh or fish.
func cmdCompletion(args []string, stdout io.Writer) error {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help") {
		fmt.Fprint(stdout, "Usage:\n  outboxrelay completion bash|zsh|fish\n\nPrint the shell completion script:\n  source <(outboxrelay completion bash)    # bash, zsh: the same with zsh\n  outboxrelay completion fish | source\n")
		return nil
	}
	if len(args) != 1 {
		return usageErr("completion needs one shell: bash, zsh or fish")
	}
	script := map[string]string{"bash": bashCompletion, "zsh": zshCompletion, "fish": fishCompletion}[args[0]]
	if script == "" {
		return usageErr("completion: unknown shell %q; use bash, zsh or fish", args[0])
	}
	_, err := fmt.Fprintf(stdout, script, strings.Join(commands, " "))
	return err
}
