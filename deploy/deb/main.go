// Command deb builds shoal's Debian package, shoal_<version>_<arch>.deb, from
// a built binary and the files under deploy/, with nfpm as a library: no tool
// is downloaded or needed at build time beyond Go. `make deb` runs it.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"time"
)

func main() {
	var o options
	flag.StringVar(&o.Binary, "binary", "bin/shoal", "the shoal binary to package (built with its version baked in)")
	flag.StringVar(&o.Version, "version", "", "the package version (Debian syntax, e.g. 0.3.0 or 0.0.0+git20261201.802e0d7)")
	flag.StringVar(&o.Arch, "arch", runtime.GOARCH, "the Debian architecture of the binary")
	flag.StringVar(&o.Deploy, "deploy", "deploy", "the deploy/ directory (unit, config, notes, maintainer scripts)")
	flag.StringVar(&o.Out, "out", ".", "where to write the package")
	date := flag.String("date", "", "the date (RFC 3339) of the changelog entry and files; default now")
	flag.Parse()
	if *date != "" {
		d, err := time.Parse(time.RFC3339, *date)
		if err != nil {
			fmt.Fprintln(os.Stderr, "deb: -date:", err)
			os.Exit(2)
		}
		o.Date = d.UTC()
	}
	path, err := build(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "deb:", err)
		os.Exit(1)
	}
	fmt.Println(path)
}
