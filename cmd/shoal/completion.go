package main

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

// The scripts ask the binary itself what may come next (urfave/cli's
// --generate-bash-completion), so they never fall behind the commands.
const bashCompletion = `# bash completion for shoal                                 -*- shell-script -*-
_shoal() {
	local cur=${COMP_WORDS[COMP_CWORD]} opts
	local words=("${COMP_WORDS[@]:0:COMP_CWORD}")
	if [[ $cur == -* ]]; then
		opts=$("${words[@]}" "$cur" --generate-bash-completion 2>/dev/null)
	else
		opts=$("${words[@]}" --generate-bash-completion 2>/dev/null)
	fi
	COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}
complete -o bashdefault -o default -F _shoal shoal
`

const zshCompletion = `#compdef shoal
# zsh completion for shoal
_shoal() {
	local -a opts
	local cur=${words[-1]}
	if [[ $cur == -* ]]; then
		opts=("${(@f)$(${words[@]:0:#words[@]-1} $cur --generate-bash-completion 2>/dev/null)}")
	else
		opts=("${(@f)$(${words[@]:0:#words[@]-1} --generate-bash-completion 2>/dev/null)}")
	fi
	if [[ -n ${opts[1]} ]]; then
		_describe 'values' opts
	else
		_files
	fi
}
compdef _shoal shoal
`

var completionCommand = &cli.Command{
	Name:      "completion",
	Usage:     "print the shell completion script for bash or zsh",
	ArgsUsage: "bash|zsh",
	Description: "Prints a completion script. The Debian package installs both; by hand:\n" +
		"  shoal completion bash > /etc/bash_completion.d/shoal\n" +
		"  shoal completion zsh > /usr/share/zsh/vendor-completions/_shoal",
	Action: func(c *cli.Context) error {
		shell, err := oneArg(c, "bash or zsh")
		if err != nil {
			return err
		}
		switch shell {
		case "bash":
			fmt.Fprint(c.App.Writer, bashCompletion)
		case "zsh":
			fmt.Fprint(c.App.Writer, zshCompletion)
		default:
			return usageError("completion: unknown shell %q: want bash or zsh", shell)
		}
		return nil
	},
}
