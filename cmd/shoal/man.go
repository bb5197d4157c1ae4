package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"
)

var manCommand = &cli.Command{
	Name:   "man",
	Hidden: true, // a packaging tool, not an operator's command
	Usage:  "write the man pages: shoal(1) and one page per command",
	Description: "Writes shoal.1 and shoal-COMMAND.1 for every command into --dir, generated\n" +
		"from the same definitions as --help, so the pages never disagree with the\n" +
		"binary. `make deb` runs it.",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "dir", Value: ".", Usage: "where to write the pages"},
	},
	Action: func(c *cli.Context) error {
		pages, err := manPages(c.App)
		if err != nil {
			return err
		}
		dir := c.String("dir")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		for name, page := range pages {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(page), 0o644); err != nil {
				return err
			}
		}
		fmt.Fprintf(c.App.Writer, "wrote %d man pages to %s\n", len(pages), dir)
		return nil
	},
}

// manPages renders shoal(1) and one page per visible command, by file name.
// A command's page is the man page of an app named after it ("shoal-drainstop"),
// so its subcommands and flags are listed the way urfave/cli lists an app's.
func manPages(app *cli.App) (map[string]string, error) {
	pages := map[string]string{}
	top := *app
	top.Commands = visible(app.Commands)
	page, err := top.ToManWithSection(1)
	if err != nil {
		return nil, fmt.Errorf("shoal(1): %w", err)
	}
	pages["shoal.1"] = seeAlso(page, top.Commands)
	for _, cmd := range top.Commands {
		sub := &cli.App{
			Name:        "shoal-" + cmd.Name,
			Usage:       cmd.Usage,
			UsageText:   "shoal " + cmd.Name + " " + strings.TrimSpace("[options] "+cmd.ArgsUsage),
			Description: cmd.Description,
			Flags:       cmd.Flags,
			Commands:    visible(cmd.Subcommands),
		}
		page, err := sub.ToManWithSection(1)
		if err != nil {
			return nil, fmt.Errorf("shoal-%s(1): %w", cmd.Name, err)
		}
		pages["shoal-"+cmd.Name+".1"] = page + ".SH SEE ALSO\n.BR shoal (1)\n"
	}
	return pages, nil
}

func visible(cmds []*cli.Command) []*cli.Command {
	var out []*cli.Command
	for _, c := range cmds {
		if !c.Hidden && c.Name != "help" {
			out = append(out, c)
		}
	}
	return out
}

// seeAlso points shoal(1) at every command's page.
func seeAlso(page string, cmds []*cli.Command) string {
	var b strings.Builder
	b.WriteString(page)
	b.WriteString(".SH SEE ALSO\n")
	for i, c := range cmds {
		sep := ","
		if i == len(cmds)-1 {
			sep = ""
		}
		fmt.Fprintf(&b, ".BR shoal-%s (1)%s\n", c.Name, sep)
	}
	return b.String()
}
