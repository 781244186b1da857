package harness

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// FreePorts picks n different loopback ports nobody listens on now, for
// programs whose port must stay the same across restarts (a server's
// settings, or a Proc's later lifetimes). The ports come from below the
// kernel's ephemeral range (ip_local_port_range), not from a port-0 listen:
// a port the kernel handed out as ephemeral may be taken, in the seconds
// between a program's exit and its restart, by any client socket on the
// machine (it happened: a shim restarted by a proof failed "bind: address
// already in use" thirty times, and the stack's second Kafka once could
// not bind). Below that range only another picker like this one can
// collide, and each pick is checked by binding it.
func FreePorts(n int) ([]int, error) {
	low := ephemeralLow()
	const floor = 10000
	if low-floor < 100*n {
		// An unusual range leaves no room below it: ask the kernel.
		addrs, err := FreeAddrs(n)
		if err != nil {
			return nil, err
		}
		ports := make([]int, n)
		for i, a := range addrs {
			_, port, _ := net.SplitHostPort(a)
			ports[i], _ = strconv.Atoi(port)
		}
		return ports, nil
	}
	var ports []int
	seen := map[int]bool{}
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000 {
			return nil, fmt.Errorf("no %d free ports between %d and %d", n, floor, low)
		}
		p := floor + rand.IntN(low-floor)
		if seen[p] {
			continue
		}
		seen[p] = true
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue // taken
		}
		ln.Close()
		ports = append(ports, p)
	}
	return ports, nil
}

// freeStableAddrs is FreePorts as "127.0.0.1:port" addresses.
func freeStableAddrs(n int) ([]string, error) {
	ports, err := FreePorts(n)
	if err != nil {
		return nil, err
	}
	out := make([]string, n)
	for i, p := range ports {
		out[i] = fmt.Sprintf("127.0.0.1:%d", p)
	}
	return out, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768
// when it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	low, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return low
}
