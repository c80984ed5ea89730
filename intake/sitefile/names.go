// Package sitefile writes what intake puts on a partner's site beside
// the partner's own files: their names (within one remote name's bytes),
// the atomic put through a hidden temporary name, receipts and their
// sealing to the partner's key, and a discard's publication. The pipeline
// that writes them, and the reconciler and the ops views that find or
// rewrite them, share this one spelling.
package sitefile

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/partners"
)

// Suffixes of a file's reports.
const (
	ReceiptSuffix = ".receipt.json"
	RejectsSuffix = ".rejects.csv"
)

// ReasonSuffix ends the name of the reason file beside a held file.
const ReasonSuffix = ".reason.json"

// EncryptedSuffix ends the name of a report encrypted to the partner's
// key (pgp.encrypt_reports_to).
const EncryptedSuffix = ".asc"

// tempPattern matches the hidden temporary names the pipeline writes under:
// .<name>.<16 hex>.tmp (the reconciler removes stale ones).
var tempPattern = regexp.MustCompile(`^\..*\.[0-9a-f]{16}\.tmp$`)

// IsOurTemp reports whether name is one of the pipeline's temporary names.
func IsOurTemp(name string) bool { return tempPattern.MatchString(name) }

// MaxName bounds a generated remote name as partners.SafeName
// bounds a partner's.
const MaxName = partners.MaxNameBytes

// FitName returns prefix+base+suffix when it fits in one remote name
// (MaxName bytes, the limit of every common file system). Otherwise
// base, the partner-derived part, is cut at a UTF-8 boundary and followed
// by "~" and a hash of the whole untruncated name: two long names that
// share a beginning still get different names, and the same input always
// gets the same name (a resumed step finds what an earlier attempt wrote).
// prefix and suffix are ours and short (well under 200 bytes).
func FitName(prefix, base, suffix string) string {
	full := prefix + base + suffix
	if len(full) <= MaxName {
		return full
	}
	sum := sha256.Sum256([]byte(full))
	mark := "~" + hex.EncodeToString(sum[:6])
	cut := MaxName - len(prefix) - len(suffix) - len(mark)
	if cut < 0 {
		cut = 0
	}
	for cut > 0 && !utf8.RuneStart(base[cut]) {
		cut--
	}
	return prefix + base[:cut] + mark + suffix
}

// FitStem is FitName for a name that other names are derived from by
// appending one of our suffixes: room for the longest of them (reserve) is
// kept, so each derived name fits too.
func FitStem(prefix, base, suffix, reserve string) string {
	return strings.TrimSuffix(FitName(prefix, base, suffix+reserve), reserve)
}

// ReasonName is the reason file beside a held file.
func ReasonName(held string) string { return held + ReasonSuffix }

// TempName is Put's hidden temporary name for name.
func TempName(name string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return FitName(".", name, "."+hex.EncodeToString(b[:])+".tmp")
}

// HeldReserve: the suffixes of names derived from a held file's name.
const HeldReserve = partners.ManifestSuffix + ReasonSuffix

// HeldName is the name of a held file in quarantine/:
// <intake_id>.<name>, and beside it <that>.complete (its manifest) and
// <that>.reason.json, all within MaxName bytes.
func HeldName(id int64, name string) string {
	return FitStem(fmt.Sprintf("%d.", id), name, "", HeldReserve)
}

// MaxArchiveExt: a longer "extension" is part of a name, not a type, and
// is left out of archive names.
const MaxArchiveExt = 32

// ArchiveNames are the candidate archive names of in:
// <batch>.<sha12>.<intake_id>[.n]<ext>, n from 1 to extra, each with room
// for partners.ManifestSuffix.
func ArchiveNames(dir string, in *ledger.Intake, extra int) []string {
	ext := path.Ext(in.RemoteName)
	if len(ext) > MaxArchiveExt {
		ext = ""
	}
	out := make([]string, 0, extra+1)
	for i := 0; i <= extra; i++ {
		n := ""
		if i > 0 {
			n = fmt.Sprintf(".%d", i)
		}
		out = append(out, path.Join(dir, FitStem("", in.BatchID, fmt.Sprintf(".%s.%d%s%s", in.SHA256[:12], in.ID, n, ext), partners.ManifestSuffix)))
	}
	return out
}
