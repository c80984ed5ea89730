package sitefile

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"path"
	"slices"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"
	"github.com/partner-intake/partner-intake/partners/sftpconn"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/pgpkeys"
	"github.com/partner-intake/partner-intake/partners"
)

// Receipt is reports/<batch>.<intake_id>.receipt.json.
type Receipt struct {
	PartnerID   string         `json:"partner_id"`
	IntakeID    int64          `json:"intake_id"`
	File        string         `json:"file"`
	BatchID     string         `json:"batch_id,omitempty"`
	SHA256      string         `json:"sha256,omitempty"`
	Bytes       int64          `json:"bytes"`
	Outcome     ledger.Outcome `json:"outcome"`
	Reason      reason.Code    `json:"reason,omitempty"`
	Line        int64          `json:"line,omitempty"`
	Detail      string         `json:"detail,omitempty"`
	DuplicateOf int64          `json:"duplicate_of,omitempty"`
	// SupersededBy: outcome superseded, the newer snapshot's intake.
	SupersededBy int64 `json:"superseded_by,omitempty"`
	// ReplayedBy: the replay ops ran of this file since (its bytes
	// applied again), whose receipt and rejects report say which of its
	// rows stand now; this receipt's rejects report is gone.
	ReplayedBy  int64       `json:"replayed_by,omitempty"`
	Rows        ReceiptRows `json:"rows"`
	Archive     string      `json:"archive_path,omitempty"`
	Quarantine  string      `json:"quarantine_path,omitempty"`
	Rejects     string      `json:"rejects_report,omitempty"`
	ProcessedAt time.Time   `json:"processed_at"`
}

// ReceiptRows are the row totals; they add up to Total.
type ReceiptRows struct {
	Total     int64 `json:"total"`
	Applied   int64 `json:"applied"`
	Unchanged int64 `json:"unchanged"`
	Rejected  int64 `json:"rejected"`
	Conflict  int64 `json:"conflict"`
	// Deleted: rows of the partner's earlier files a snapshot deleted (or
	// marked deleted) because their key is not in this file; not rows of
	// this file, so not part of Total.
	Deleted int64 `json:"deleted,omitempty"`
	// DeleteKept: rows of the partner's earlier files a snapshot would
	// have deleted but kept, because they were edited outside intake since
	// intake wrote them (reason outside_edit); not part of Total.
	DeleteKept int64 `json:"delete_kept_outside_edit,omitempty"`
	// AppliedEarlier: rows of this file its runs applied before ops
	// released it for another run; they stand. Not part of Total: the
	// runs after the release count them again, as unchanged.
	AppliedEarlier int64 `json:"applied_before_release,omitempty"`
}

// ReportStem names a file's reports: <batch>.<intake_id>, unique per
// observed file so a resend's receipt never overwrites the original's;
// with either suffix within MaxName bytes.
func ReportStem(in *ledger.Intake) string {
	if in.BatchID != "" {
		return FitStem("", in.BatchID, fmt.Sprintf(".%d", in.ID), ReceiptSuffix+EncryptedSuffix)
	}
	return fmt.Sprintf("intake-%d", in.ID)
}

// EarlierNames are the names in the reports dir under which an earlier
// decision of the intake may have published a report of this kind
// (suffix: ReceiptSuffix or RejectsSuffix) other than keep: the stem
// changes once the file's batch id is known (a file held before it was
// read has none, intake-ID), and the encrypted suffix with the feed's
// encrypt_reports_to as it was then (or the feed gone). A decision after
// an earlier one removes them, so the partner reads one report of a
// kind, the latest decision's.
func EarlierNames(in *ledger.Intake, suffix, keep string) []string {
	var names []string
	for _, stem := range []string{ReportStem(in), fmt.Sprintf("intake-%d", in.ID)} {
		for _, n := range []string{stem + suffix, stem + suffix + EncryptedSuffix} {
			if n != keep && !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	return names
}

// RemoveEarlier removes from the site's reports dir what EarlierNames
// names, and recorded, the path the row recorded for the earlier
// decision's report of this kind ("": none), wherever it is: the batch
// rule or the reports dir may have changed since. The caller has fenced
// right before.
func RemoveEarlier(s *sftpconn.Session, in *ledger.Intake, suffix, keep, recorded string) error {
	dir := s.Layout.ReportsDir()
	paths := []string{}
	for _, n := range EarlierNames(in, suffix, keep) {
		paths = append(paths, path.Join(dir, n))
	}
	if recorded != "" && recorded != path.Join(dir, keep) && !slices.Contains(paths, recorded) {
		paths = append(paths, recorded)
	}
	for _, p := range paths {
		if err := s.Remove(p); err != nil && !sftpconn.IsNotExist(err) {
			return fmt.Errorf("remove an earlier decision's report: %w", err)
		}
	}
	return nil
}

// ReceiptJSON completes rc with what the row says of the file and renders
// it.
func ReceiptJSON(in *ledger.Intake, rc Receipt) ([]byte, error) {
	rc.PartnerID, rc.IntakeID, rc.File, rc.BatchID = in.Partner, in.ID, in.RemoteName, in.BatchID
	rc.SHA256, rc.Bytes = in.SHA256, in.Size
	rc.Rows = ReceiptRows{Total: in.RowsTotal, Applied: in.RowsApplied, Unchanged: in.RowsUnchanged, Rejected: in.RowsRejected, Conflict: in.RowsConflict, Deleted: in.RowsDeleted, DeleteKept: in.RowsDeleteKept, AppliedEarlier: in.RowsAppliedEarlier}
	if rc.ProcessedAt.IsZero() {
		rc.ProcessedAt = time.Now().UTC()
	}
	rc.ProcessedAt = rc.ProcessedAt.UTC().Truncate(time.Second)
	data, err := json.MarshalIndent(rc, "", "  ")
	return append(data, '\n'), err
}

// PGPOf is the pgp setting of the feed named feed, or nil.
func PGPOf(p *partners.Config, feed string) *partners.PGP {
	if p == nil {
		return nil
	}
	for i := range p.Feeds {
		if p.Feeds[i].Name == feed {
			return p.Feeds[i].PGP
		}
	}
	return nil
}

// Seal encrypts a report to the partner's key when the feed says
// encrypt_reports_to: an armored OpenPGP message signed by intake's key,
// its name ending in EncryptedSuffix. Otherwise data and name unchanged.
func Seal(cfg *partners.PGP, data []byte, name string) ([]byte, string, error) {
	if cfg == nil || cfg.EncryptReportsTo == "" {
		return data, name, nil
	}
	var b bytes.Buffer
	w, sealed, err := SealTo(&b, cfg, name)
	if err != nil {
		return nil, "", err
	}
	if _, err := w.Write(data); err != nil {
		return nil, "", err
	}
	if err := w.Close(); err != nil {
		return nil, "", err
	}
	return b.Bytes(), sealed, nil
}

// SealedName is the name a report of name is published under: with
// EncryptedSuffix when the feed encrypts its reports (Seal, SealTo).
func SealedName(cfg *partners.PGP, name string) string {
	if cfg == nil || cfg.EncryptReportsTo == "" {
		return name
	}
	return name + EncryptedSuffix
}

// SealTo returns a writer that seals what is written to it into dst as
// Seal does, as a stream, and the sealed name; closing it ends the
// message. Without encrypt_reports_to it writes to dst unchanged.
func SealTo(dst io.Writer, cfg *partners.PGP, name string) (io.WriteCloser, string, error) {
	if cfg == nil || cfg.EncryptReportsTo == "" {
		return nopCloser{dst}, name, nil
	}
	to, err := pgpkeys.Load(cfg.EncryptReportsTo, "")
	if err != nil {
		return nil, "", err
	}
	secret, err := pgpkeys.Load(cfg.PrivateKeyFile, cfg.PassphraseEnv)
	if err != nil {
		return nil, "", err
	}
	var signer *openpgp.Entity
	for _, e := range secret {
		if _, ok := e.SigningKey(time.Now()); ok && e.PrivateKey != nil && !e.PrivateKey.Encrypted {
			signer = e
			break
		}
	}
	aw, err := armor.Encode(dst, "PGP MESSAGE", nil)
	if err != nil {
		return nil, "", err
	}
	w, err := openpgp.Encrypt(aw, to, signer, &openpgp.FileHints{FileName: name}, nil)
	if err != nil {
		return nil, "", fmt.Errorf("encrypt report to %s: %w", cfg.EncryptReportsTo, err)
	}
	return sealWriter{w, aw}, name + EncryptedSuffix, nil
}

// sealWriter closes the OpenPGP message, then its armor.
type sealWriter struct{ msg, armor io.WriteCloser }

func (s sealWriter) Write(p []byte) (int, error) { return s.msg.Write(p) }

func (s sealWriter) Close() error {
	if err := s.msg.Close(); err != nil {
		return err
	}
	return s.armor.Close()
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }
