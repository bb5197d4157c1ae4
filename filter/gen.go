package filter

// The XDP program (xdp/shoal.c) compiled for little-endian BPF; the
// generated shoal_bpfel.go and shoal_bpfel.o are committed so that building
// shoal needs no clang. Run `make generate` after changing the C.
//go:generate go tool bpf2go -target bpfel -output-stem shoal -cflags "-O2 -g -Wall -I/usr/include/x86_64-linux-gnu" shoal xdp/shoal.c
