// Command sockfill fills the network namespace it runs in with TCP sockets
// that have nothing to do with any VIP, so benchmarks can show what they
// cost the agent: loopback connections left in TIME_WAIT (no process holds
// them; the kernel keeps each for 60 s) or kept established (held until
// sockfill is killed).
//
//	ip netns exec NS sockfill -mode timewait -count 100000      # returns once made
//	ip netns exec NS sockfill -mode established -count 100000   # holds until killed
//
// It prints "ready N" once the sockets exist. It touches only loopback
// addresses of the namespace it runs in (127.<block>.x.1 to 127.0.0.1), and
// sets that namespace's net.ipv4.tcp_tw_reuse to 0 and tcp_max_tw_buckets
// high enough, so that no TIME_WAIT socket it made is reused or refused.
// Established sockets need a file descriptor each: beyond what one process
// may open, sockfill runs copies of itself, each with a share.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

func main() {
	mode := flag.String("mode", "timewait", "timewait or established")
	count := flag.Int("count", 100000, "sockets to make")
	block := flag.Int("block", 1, "source addresses are 127.<block>.x.1 (1-250); copies take the next blocks")
	workers := flag.Int("workers", 8, "parallel connectors")
	flag.Parse()
	if err := run(*mode, *count, *block, *workers); err != nil {
		fmt.Fprintln(os.Stderr, "sockfill:", err)
		os.Exit(1)
	}
}

// Every connection gets its own source address and port, bound explicitly:
// connect() would otherwise search the ephemeral range for a free port past
// every TIME_WAIT socket already made, which grows quadratically.
const (
	firstPort = 20000
	portsPer  = 25000 // source ports per source address
)

func run(mode string, count, block, workers int) error {
	if count < 0 || workers < 1 || block < 1 || block > 250 {
		return errors.New("want -count >= 0, -workers >= 1, -block 1..250")
	}
	conns := count // TIME_WAIT: one socket per connection, on the client side
	switch mode {
	case "timewait":
		if err := sysctl("net/ipv4/tcp_tw_reuse", "0"); err != nil {
			return err
		}
		if err := sysctl("net/ipv4/tcp_max_tw_buckets", fmt.Sprint(4*count+1024)); err != nil {
			return err
		}
	case "established":
		conns = (count + 1) / 2 // two sockets per connection
		if most := fdLimit() - 256; count > most {
			return copies(count, most, block, workers)
		}
	default:
		return fmt.Errorf("-mode %q: want timewait or established", mode)
	}
	if block+conns/(256*portsPer) > 250 {
		return fmt.Errorf("-count %d: too many for the source addresses from 127.%d.0.1", count, block)
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return err
	}
	var (
		mu   sync.Mutex
		held []net.Conn // established mode: both ends, kept open
	)
	keep := func(c net.Conn) {
		mu.Lock()
		held = append(held, c)
		mu.Unlock()
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if mode == "established" {
				keep(c)
				continue
			}
			// The client closes first (and so holds the TIME_WAIT);
			// close this end once it has.
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	var next atomic.Int64
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= conns {
					return
				}
				src := &net.TCPAddr{IP: net.IPv4(127, byte(block+i/(256*portsPer)), byte(i/portsPer), 1), Port: firstPort + i%portsPer}
				d := net.Dialer{LocalAddr: src}
				c, err := d.Dial("tcp4", ln.Addr().String())
				if err != nil {
					errc <- err
					return
				}
				if mode == "established" {
					keep(c)
				} else {
					c.Close()
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return err
	}
	fmt.Printf("ready %d\n", count)
	if mode == "timewait" {
		return nil
	}
	waitSignal()
	return nil
}

// copies runs copies of sockfill of at most per established sockets each,
// on blocks of source addresses of their own, until a signal comes.
func copies(count, per, block, workers int) error {
	per -= per % 2
	if per < 2 {
		return errors.New("the open file limit is too low")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var kids []*exec.Cmd
	defer func() {
		for _, k := range kids {
			k.Process.Signal(syscall.SIGTERM)
			k.Wait()
		}
	}()
	for made := 0; made < count; made += per {
		n := min(per, count-made)
		blocks := 1 + (n/2)/(256*portsPer)
		k := exec.Command(self, "-mode", "established", "-count", fmt.Sprint(n), "-block", fmt.Sprint(block), "-workers", fmt.Sprint(workers))
		block += blocks
		k.Stderr = os.Stderr
		out, err := k.StdoutPipe()
		if err != nil {
			return err
		}
		if err := k.Start(); err != nil {
			return err
		}
		kids = append(kids, k)
		line, _ := bufio.NewReader(out).ReadString('\n')
		if !strings.HasPrefix(line, "ready") {
			return fmt.Errorf("a copy of sockfill (%d sockets) failed", n)
		}
	}
	fmt.Printf("ready %d\n", count)
	waitSignal()
	return nil
}

func waitSignal() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}

// fdLimit raises the soft limit of open files to the hard one and returns it.
func fdLimit() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 1024
	}
	lim.Cur = lim.Max
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	return int(min(lim.Cur, 1<<24))
}

// sysctl writes a sysctl of this process's network namespace.
func sysctl(name, value string) error {
	if err := os.WriteFile("/proc/sys/"+name, []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", name, value, err)
	}
	return nil
}
