package harness

import (
	"bufio"
	"io"
	"strconv"
	"strings"
)

// SumMetrics reads Prometheus text (what /metrics serves) and sums each
// metric's samples over their labels, for the metrics keep accepts (nil:
// all). A histogram's _bucket, _count and _sum are metrics of their own
// here, and lines it cannot read are skipped.
func SumMetrics(r io.Reader, keep func(name string) bool) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name := line
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
		}
		if keep != nil && !keep(name) {
			continue
		}
		rest := line[len(name):]
		if strings.HasPrefix(rest, "{") {
			// Label values may hold spaces; the value follows the last '}'.
			rest = rest[strings.LastIndexByte(rest, '}')+1:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		out[name] += v
	}
	return out, sc.Err()
}
