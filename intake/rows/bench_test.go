package rows

import (
	"bytes"
	"fmt"
	"io"
	"testing"

	"github.com/partner-intake/partner-intake/partners"
)

// ordersFeed is the benchmark's orders feed (internal/bench).
func ordersFeed(b *testing.B) *partners.Feed {
	f := &partners.Feed{Name: "orders", Pattern: `orders-.*\.csv`, Target: "bench_orders", Key: []string{"order_id"},
		Columns: []partners.Column{
			{Name: "order_id", Type: "text", Required: true, MaxLength: 32},
			{Name: "email", Type: "email"},
			{Name: "amount", Type: "decimal", Scale: 2, Required: true},
			{Name: "status", Type: "enum", Values: []string{"new", "paid", "shipped", "returned"}, Required: true},
			{Name: "placed_at", Type: "timestamp", Required: true},
			{Name: "note", Type: "text", MaxLength: 200},
			{Name: "qty", Type: "integer"},
		}}
	f.SetDefaults()
	if err := f.Validate("feed", partners.ReadinessRename); err != nil {
		b.Fatal(err)
	}
	return f
}

// BenchmarkReader reads 100k orders-like rows (the shape `make bench` uses).
func BenchmarkReader(b *testing.B) {
	var buf bytes.Buffer
	fmt.Fprintln(&buf, "order_id,email,amount,status,placed_at,note,qty")
	statuses := []string{"new", "paid", "shipped", "returned"}
	for k := 0; k < 100_000; k++ {
		fmt.Fprintf(&buf, "ORD-%09d,customer%d@example.com,%d.%02d,%s,2026-%02d-%02dT%02d:%02d:00Z,deliver to dock %d,%d\n",
			k, k%100000, k%10000, k%100, statuses[k%4], 1+k%12, 1+k%28, k%24, k%60, k%50, 1+k%9)
	}
	f := ordersFeed(b)
	b.SetBytes(int64(buf.Len()))
	b.ResetTimer()
	for range b.N {
		rd, err := NewReader(bytes.NewReader(buf.Bytes()), f, 0)
		if err != nil {
			b.Fatal(err)
		}
		for {
			row, err := rd.Next()
			if err == io.EOF {
				break
			}
			if err != nil || row.Issue != nil {
				b.Fatal(err, row.Issue)
			}
		}
	}
}

// BenchmarkCountFields is the record bound's count of a record's fields
// (recordLimit.countFields) over the same rows, alone: a pass over every
// byte the CSV reader is handed.
func BenchmarkCountFields(b *testing.B) {
	var buf bytes.Buffer
	for k := 0; k < 100_000; k++ {
		fmt.Fprintf(&buf, "ORD-%09d,customer%d@example.com,%d.%02d,\"paid, \"\"in full\"\"\",2026-%02d-%02dT%02d:%02d:00Z,deliver to dock %d,%d\n",
			k, k%100000, k%10000, k%100, 1+k%12, 1+k%28, k%24, k%60, k%50, 1+k%9)
	}
	b.SetBytes(int64(buf.Len()))
	b.ResetTimer()
	for range b.N {
		l := &recordLimit{comma: []byte{','}, maxFields: 100}
		for p := buf.Bytes(); len(p) > 0; {
			n := min(len(p), 4096)
			if l.countFields(p[:n]) {
				b.Fatal("more fields than the bound")
			}
			p = p[n:]
		}
		if l.lines != 100_000 {
			b.Fatalf("%d lines counted", l.lines)
		}
	}
}
