# shoal: build, test, regenerate the XDP objects, benchmark.
GO ?= go

.PHONY: all build test generate lab bench check deb

all: build

# What `shoal version` and the package say: the tag (v1.2.3 -> 1.2.3) or,
# between tags, 0.0.0+git<commit date>.<commit>; the build date is the
# commit's, so two builds of one commit are the same.
COMMIT  ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
DATE    ?= $(shell git log -1 --format=%cI 2>/dev/null || date -u +%Y-%m-%dT%H:%M:%SZ)
VERSION ?= $(shell git describe --tags --exact-match --match 'v[0-9]*' 2>/dev/null | sed 's/^v//' | grep . || \
	echo 0.0.0+git$$(git log -1 --format=%cd --date=format:%Y%m%d 2>/dev/null || date -u +%Y%m%d).$(COMMIT))
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.buildDate=$(DATE)

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/shoal ./cmd/shoal

# The Debian package, shoal_<version>_<arch>.deb in bin/ (see deploy/deb).
deb:
	$(GO) build -trimpath -buildmode=pie -ldflags "-s -w $(LDFLAGS)" -o bin/deb/shoal ./cmd/shoal
	$(GO) run ./deploy/deb -binary bin/deb/shoal -version $(VERSION) -date $(DATE) -out bin

# The test command: unit, differential, namespace and lab tests. As root the
# XDP and namespace tests run for real; otherwise they skip with a reason.
# Packages run one at a time (-p 1): the lab tests of agent, deploy/lab and
# deploy/drill time failovers, and must not share two cores with each other.
test:
	$(GO) vet ./...
	$(GO) test -count=1 -p 1 -timeout 30m ./...

# Regenerate the bpf2go output from filter/xdp/*.c (needs clang, llvm and
# libbpf-dev: apt-get install clang llvm libbpf-dev).
generate:
	$(GO) generate ./...

# The lab: a whole cluster in network namespaces, traffic, a pulled plug, a report.
lab: build
	./bin/shoal lab run

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
