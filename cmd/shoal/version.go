package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/urfave/cli/v2"
)

// Set at build time with -ldflags "-X main.version=... -X main.commit=...
// -X main.buildDate=..." (make build and make deb do); left empty, they are
// taken from the module and VCS information Go records in the binary.
var (
	version   string
	commit    string
	buildDate string
)

// features names what this binary can do that a packaging script or a peer
// may need to know before relying on it. "hitless-restart": its agent adopts
// the data plane an agent stopped by `shoal restart` left pinned
// (agent/restart.go); the package's upgrade script then runs `shoal restart`
// and `systemctl restart` instead of draining the node.
var features = []string{"hitless-restart"}

// BuildInfo is what `shoal version --json` prints.
type BuildInfo struct {
	Version   string   `json:"version"`
	Commit    string   `json:"commit"`
	BuildDate string   `json:"build_date"`
	Go        string   `json:"go"`
	Platform  string   `json:"platform"`
	Features  []string `json:"features"`
}

// buildInfo fills what the linker did not set from the binary's own record.
func buildInfo() BuildInfo {
	b := BuildInfo{Version: version, Commit: commit, BuildDate: buildDate, Go: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH, Features: features}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if b.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			b.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && b.Commit == "":
				b.Commit = s.Value
			case s.Key == "vcs.time" && b.BuildDate == "":
				b.BuildDate = s.Value
			}
		}
	}
	if b.Version == "" {
		b.Version = "devel"
	}
	if b.Commit == "" {
		b.Commit = "unknown"
	}
	if b.BuildDate == "" {
		b.BuildDate = "unknown"
	}
	return b
}

var versionCommand = &cli.Command{
	Name:  "version",
	Usage: "print the version, commit and build date of this binary",
	Description: "Prints what this binary is: its version, the commit it was built from, when,\n" +
		"and with which Go. Packaged binaries carry the package's version. It needs no\n" +
		"agent.",
	Flags: []cli.Flag{jsonFlag},
	Action: func(c *cli.Context) error {
		if c.NArg() > 0 {
			return usageError("version takes no arguments")
		}
		b := buildInfo()
		if c.Bool("json") {
			return printJSON(c.App.Writer, b)
		}
		fmt.Fprintf(c.App.Writer, "shoal %s\ncommit %s\nbuilt %s with %s for %s\n", b.Version, b.Commit, b.BuildDate, b.Go, b.Platform)
		return nil
	},
}
