package target

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// Every binary encoder stores exactly what PostgreSQL's own text input
// makes of the same canonical string (the COPY text path).
func TestBinaryEncodersAgreeWithPostgresTextInput(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SET TimeZone = 'UTC'"); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		feedType, pgType string
		oid              uint32
		values           []string
	}{
		{partners.TypeText, "text", oidText, []string{"héllo", "tab\tand\nnewline", `back\slash`, "x"}},
		{partners.TypeEmail, "varchar(40)", oidVarchar, []string{"a@example.com"}},
		{partners.TypeInteger, "smallint", oidInt2, []string{"0", "-1", "32767", "-32768"}},
		{partners.TypeInteger, "integer", oidInt4, []string{"0", "42", "-2147483648", "2147483647"}},
		{partners.TypeInteger, "bigint", oidInt8, []string{"9223372036854775807", "-9223372036854775808", "7"}},
		{partners.TypeInteger, "numeric", oidNumeric, []string{"0", "123456789", "-10000"}},
		{partners.TypeDecimal, "numeric", oidNumeric, []string{"0", "1", "-1", "0.5", "0.0001", "0.00001", "10000", "9999.9999",
			"12345.6789", "-99999.99", "100000000.01", "123456789012345678901234567890.123456789", "0.1", "1000.001"}},
		{partners.TypeDecimal, "numeric(12,2)", oidNumeric, []string{"0", "10.5", "-3.1", "9999999999.99", "0.01",
			"1.005", "-1.005", "9.995", "-9.995", "0.004", "-0.004", "0.005", "99.999", "1.00449", "12345.6789"}},
		{partners.TypeDecimal, "numeric(10,0)", oidNumeric, []string{"0.5", "-0.5", "0.4", "-0.4", "9999.5", "12"}},
		{partners.TypeInteger, "numeric(12,3)", oidNumeric, []string{"0", "-7", "123456789"}},
		{partners.TypeText, "varchar(3)", oidVarchar, []string{"abc", "ab", "", "abc   ", "é€😀 ", "a  "}},
		{partners.TypeTimestamp, "timestamptz(0)", oidTimestamptz, []string{"2026-01-02T03:04:05.5Z", "1999-12-31T23:59:59.4999Z",
			"1960-07-08T09:10:11.5Z", "1960-07-08T09:10:11.49Z", "2026-01-02T03:04:05Z"}},
		{partners.TypeTimestamp, "timestamp(3)", oidTimestamp, []string{"2026-01-02T03:04:05.0005Z", "1950-01-02T03:04:05.0005Z",
			"1950-01-02T03:04:05.0004Z", "2026-01-02T03:04:05.1234565Z"}},
		{partners.TypeTimestamp, "timestamptz", oidTimestamptz, []string{"2026-01-02T03:04:05Z", "1999-12-31T23:59:59.999999Z",
			"1970-01-01T00:00:00Z", "2026-01-02T03:04:05.1234565Z", "2026-01-02T03:04:05.1234575Z", "2026-06-01T00:00:00.0000005Z",
			"0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "1900-03-04T05:06:07.5Z"}},
		{partners.TypeTimestamp, "timestamp", oidTimestamp, []string{"2026-01-02T03:04:05Z", "1960-07-08T09:10:11.25Z"}},
		{partners.TypeDate, "date", oidDate, []string{"2000-01-01", "1999-12-31", "0001-01-01", "9999-12-31", "2026-02-28", "1960-02-29"}},
	}
	for i, c := range cases {
		table := fmt.Sprintf("bin_%d", i)
		if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE TEMP TABLE %s (n int, v %s)", table, c.pgType)); err != nil {
			t.Fatal(err)
		}
		var typmod int32
		if err := conn.QueryRow(ctx, "SELECT atttypmod FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'v'", table).Scan(&typmod); err != nil {
			t.Fatal(err)
		}
		enc := binaryEncoder(c.feedType, c.oid, typmod)
		if enc == nil {
			t.Fatalf("no encoder for %s into %s", c.feedType, c.pgType)
		}
		payload := append([]byte(nil), copyBinaryHeader...)
		for n, v := range c.values {
			payload = binary.BigEndian.AppendUint16(payload, 2)
			payload = binary.BigEndian.AppendUint32(payload, 4)
			payload = binary.BigEndian.AppendUint32(payload, uint32(n))
			val, err := enc(nil, v)
			if err != nil {
				t.Fatalf("%s %q: %v", c.pgType, v, err)
			}
			payload = binary.BigEndian.AppendUint32(payload, uint32(len(val)))
			payload = append(payload, val...)
		}
		payload = append(payload, copyBinaryTrailer...)
		if _, err := conn.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(payload), fmt.Sprintf("COPY %s (n, v) FROM STDIN WITH (FORMAT binary)", table)); err != nil {
			t.Fatalf("%s: %v", c.pgType, err)
		}
		for n, v := range c.values {
			var got, want string
			if err := conn.QueryRow(ctx, fmt.Sprintf("SELECT v::text, $1::%s::text FROM %s WHERE n = $2", c.pgType, table), v, n).Scan(&got, &want); err != nil {
				t.Fatalf("%s %q: %v", c.pgType, v, err)
			}
			if got != want {
				t.Errorf("%s %q: binary stored %q, text input %q", c.pgType, v, got, want)
			}
		}
	}
	if binaryEncoder(partners.TypeDate, oidTimestamptz, -1) != nil || binaryEncoder(partners.TypeDecimal, oidInt4, -1) != nil {
		t.Fatal("a pair left to the text path got a binary encoder")
	}
	if _, err := encodeInt(16)(nil, "40000"); err == nil {
		t.Fatal("40000 encoded as a smallint")
	}
}
