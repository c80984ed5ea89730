package target

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// hashBytesExtended is the server's hash_bytes_extended for every length
// of tail (checkRowHash), and a session whose client_encoding is not UTF8
// (textsend would convert text to it) gets no Go hash.
func TestRowHashIsTheServers(t *testing.T) {
	url, pool := testenv.DB(t)
	ctx := context.Background()
	ok, err := checkRowHash(ctx, pool)
	if err != nil || !ok {
		t.Fatalf("checkRowHash = %v, %v: Go's hash_bytes_extended differs from the server's", ok, err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["client_encoding"] = "LATIN1"
	latin, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer latin.Close()
	if ok, err := checkRowHash(ctx, latin); err != nil || ok {
		t.Fatalf("checkRowHash under client_encoding LATIN1 = %v, %v: want false", ok, err)
	}
	// and the hash is not a constant: one changed byte changes it
	if hashBytesExtended([]byte("intake"), 0) == hashBytesExtended([]byte("intakf"), 0) {
		t.Fatal("one changed byte left the hash as it was")
	}
}
