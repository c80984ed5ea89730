package bench

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The rejects workload's file rejects exactly every tenth row (a status
// outside the feed's enum) and the plan workload's changes every row's
// qty and nothing else: the figures' checks count on both.
func TestVariantRows(t *testing.T) {
	dir := t.TempDir()
	lines := func(name string, v variant) []string {
		p := filepath.Join(dir, name)
		if _, err := writeCSVVariant(p, 100, 7, v); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	}
	plain, rej, bumped := lines("plain.csv", variant{}), lines("rej.csv", variant{rejectEvery: 10}), lines("bump.csv", variant{bump: 1})
	if len(plain) != 101 || len(rej) != 101 || len(bumped) != 101 {
		t.Fatalf("lines: %d, %d, %d; want 101 each (a header and 100 rows)", len(plain), len(rej), len(bumped))
	}
	lost := 0
	for i := 1; i < len(plain); i++ {
		p, r, b := strings.Split(plain[i], ","), strings.Split(rej[i], ","), strings.Split(bumped[i], ",")
		if r[3] == "lost" {
			lost++
			if (i-1)%10 != 9 {
				t.Errorf("row %d rejected, want every tenth only", i-1)
			}
			r[3] = p[3]
		}
		if strings.Join(r, ",") != plain[i] {
			t.Errorf("row %d: %q, want %q but for its status", i-1, rej[i], plain[i])
		}
		q, _ := strconv.Atoi(p[6])
		if b[6] != strconv.Itoa(q+1) || strings.Join(b[:6], ",") != strings.Join(p[:6], ",") {
			t.Errorf("row %d bumped: %q, want %q with qty %d", i-1, bumped[i], plain[i], q+1)
		}
	}
	if lost != 10 {
		t.Errorf("%d rows rejected, want 10", lost)
	}
}
