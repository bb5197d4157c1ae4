# shoal: build, test, regenerate the XDP objects, benchmark.
GO ?= go

.PHONY: all build test generate lab bench check

all: build

build:
	$(GO) build -o bin/shoal ./cmd/shoal

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
