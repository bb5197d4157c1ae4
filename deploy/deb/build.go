package main

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/goreleaser/nfpm/v2"
	"github.com/goreleaser/nfpm/v2/deb"
	"github.com/goreleaser/nfpm/v2/files"
)

// options say what to package and where.
type options struct {
	Binary  string
	Version string
	Arch    string
	Deploy  string
	Out     string
	// Date stamps the changelog and every file; zero means now (make deb
	// passes the commit's date, so a rebuild of one commit is identical).
	Date time.Time
}

const (
	maintainer = "shoal maintainers <maintainers@shoal.invalid>"
	homepage   = "https://github.com/shoalnet/shoal"
	// The unit as kept in deploy/ runs a binary installed by hand; the
	// package installs it where Debian puts packaged programs.
	handBinary = "/usr/local/bin/shoal"
	pkgBinary  = "/usr/bin/shoal"
)

var debVersion = regexp.MustCompile(`^[0-9][A-Za-z0-9.+~]*(-[A-Za-z0-9.+~]+)?$`)

// build writes the package and returns its path.
func build(o options) (string, error) {
	if !debVersion.MatchString(o.Version) {
		return "", fmt.Errorf("version %q: want a Debian version starting with a digit (make deb computes one from git)", o.Version)
	}
	if o.Date.IsZero() {
		o.Date = time.Now().UTC()
	}
	stage, err := os.MkdirTemp("", "shoal-deb-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(stage)

	contents, err := stageFiles(o, stage)
	if err != nil {
		return "", err
	}
	script := func(name string) string { return filepath.Join(o.Deploy, "deb", name) }
	info := nfpm.WithDefaults(&nfpm.Info{
		Name:          "shoal",
		Arch:          o.Arch,
		Platform:      "linux",
		Version:       o.Version,
		VersionSchema: "none", // a Debian version, used as given
		Section:       "net",
		Priority:      "optional",
		Maintainer:    maintainer,
		Homepage:      homepage,
		License:       "see /usr/share/doc/shoal/copyright",
		Description: "peer-to-peer network load balancing for Linux\n" +
			"shoal runs on every server of a web farm: the servers share virtual IPs,\n" +
			"and each keeps, in an XDP filter, only its share of the traffic.\n" +
			"Heartbeats converge membership and Raft replicates the port rules, so a\n" +
			"failed node's share moves to the survivors in about a second, and a\n" +
			"drained node finishes its connections before it stops.",
		MTime: o.Date,
		Overridables: nfpm.Overridables{
			Contents: contents,
			Umask:    0o022,
			// Go links the C library for its resolver and user lookups.
			Depends: []string{"libc6"},
			Scripts: nfpm.Scripts{
				PostInstall: script("postinst"),
				PreRemove:   script("prerm"),
				PostRemove:  script("postrm"),
			},
		},
	})
	info.Target = filepath.Join(o.Out, fmt.Sprintf("shoal_%s_%s.deb", o.Version, o.Arch))
	if err := nfpm.Validate(info); err != nil {
		return "", err
	}
	f, err := os.Create(info.Target)
	if err != nil {
		return "", err
	}
	if err := deb.Default.Package(info, f); err != nil {
		f.Close()
		os.Remove(info.Target)
		return "", fmt.Errorf("package: %w", err)
	}
	return info.Target, f.Close()
}

// stageFiles generates what the package carries beyond deploy/'s files (man
// pages, completion, the unit with the packaged path, the changelog) into
// stage, and lists every file with its place and mode.
func stageFiles(o options, stage string) (files.Contents, error) {
	var contents files.Contents
	add := func(src, dst string, mode os.FileMode, typ string) {
		contents = append(contents, &files.Content{Source: src, Destination: dst, Type: typ,
			FileInfo: &files.ContentFileInfo{Owner: "root", Group: "root", Mode: mode, MTime: o.Date}})
	}
	write := func(name string, data []byte) (string, error) {
		p := filepath.Join(stage, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		return p, os.WriteFile(p, data, 0o644)
	}
	doc := "/usr/share/doc/shoal/"

	add(o.Binary, pkgBinary, 0o755, "")

	unit, err := os.ReadFile(filepath.Join(o.Deploy, "shoal.service"))
	if err != nil {
		return nil, err
	}
	if !bytes.Contains(unit, []byte(handBinary)) && !bytes.Contains(unit, []byte(pkgBinary)) {
		return nil, fmt.Errorf("deploy/shoal.service runs neither %s nor %s: update the packager", handBinary, pkgBinary)
	}
	p, err := write("shoal.service", bytes.ReplaceAll(unit, []byte(handBinary), []byte(pkgBinary)))
	if err != nil {
		return nil, err
	}
	add(p, "/lib/systemd/system/shoal.service", 0o644, "")

	add(filepath.Join(o.Deploy, "shoal.yaml"), "/etc/shoal/shoal.yaml", 0o644, files.TypeConfigNoReplace)
	// The pristine example, so postinst can tell an edited config from the
	// shipped one.
	add(filepath.Join(o.Deploy, "shoal.yaml"), doc+"examples/shoal.yaml", 0o644, "")
	add(filepath.Join(o.Deploy, "sysctl.md"), doc+"sysctl.md", 0o644, "")
	add(filepath.Join(o.Deploy, "grafana-dashboard.json"), doc+"examples/grafana-dashboard.json", 0o644, "")
	add(filepath.Join(o.Deploy, "deb", "copyright"), doc+"copyright", 0o644, "")

	cl, err := gzipped(changelog(o))
	if err != nil {
		return nil, err
	}
	// A version without a Debian revision is a native package, whose
	// changelog has the plain name.
	clName := "changelog.gz"
	if strings.Contains(o.Version, "-") {
		clName = "changelog.Debian.gz"
	}
	if p, err = write(clName, cl); err != nil {
		return nil, err
	}
	add(p, doc+clName, 0o644, "")

	// Man pages and completion come from the binary itself.
	manDir := filepath.Join(stage, "man")
	if out, err := exec.Command(o.Binary, "man", "--dir", manDir).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%s man: %v: %s", o.Binary, err, out)
	}
	pages, err := filepath.Glob(filepath.Join(manDir, "*.1"))
	if err != nil || len(pages) == 0 {
		return nil, fmt.Errorf("%s man wrote no pages", o.Binary)
	}
	sort.Strings(pages)
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			return nil, err
		}
		gz, err := gzipped(b)
		if err != nil {
			return nil, err
		}
		if p, err = write(filepath.Base(page)+".gz", gz); err != nil {
			return nil, err
		}
		add(p, "/usr/share/man/man1/"+filepath.Base(page)+".gz", 0o644, "")
	}
	for shell, dst := range map[string]string{
		"bash": "/usr/share/bash-completion/completions/shoal",
		"zsh":  "/usr/share/zsh/vendor-completions/_shoal",
	} {
		out, err := exec.Command(o.Binary, "completion", shell).Output()
		if err != nil {
			return nil, fmt.Errorf("%s completion %s: %w", o.Binary, shell, err)
		}
		if p, err = write("completion."+shell, out); err != nil {
			return nil, err
		}
		add(p, dst, 0o644, "")
	}
	return contents, nil
}

// changelog is the Debian changelog: one entry for the packaged version (the
// project's history is its git log).
func changelog(o options) []byte {
	dist := "unstable"
	return fmt.Appendf(nil, "shoal (%s) %s; urgency=medium\n\n  * Package of shoal %s.\n    See %s for the changes.\n\n -- %s  %s\n",
		o.Version, dist, strings.SplitN(o.Version, "-", 2)[0], homepage, maintainer, o.Date.Format(time.RFC1123Z))
}

// gzipped compresses as Debian wants for docs and man pages: best
// compression, no name and no timestamp in the header.
func gzipped(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	w, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(b); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
