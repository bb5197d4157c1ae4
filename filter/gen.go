package filter

// The XDP program (xdp/shoal.c) compiled for little-endian BPF; the
// generated shoal_bpfel.go and shoal_bpfel.o are committed so that building
// shoal needs no clang. Run `make generate` after changing the C.
//go:generate go tool bpf2go -target bpfel -output-stem shoal -cflags "-O2 -g -Wall -I/usr/include/x86_64-linux-gnu" shoal xdp/shoal.c
//
// The tc-ingress build of the same C (-DSHOAL_TC): the fallback where the
// driver has no native XDP (veth included), loaded over the same maps.
//go:generate go tool bpf2go -target bpfel -output-stem shoaltc -cflags "-O2 -g -Wall -DSHOAL_TC -I/usr/include/x86_64-linux-gnu" shoalTc xdp/shoal.c
