package partners

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/partner-intake/partner-intake/internal/names"
	"github.com/partner-intake/partner-intake/internal/setting"
)

// Batch-id sources.
const (
	BatchFromStem     = "stem"     // file name without its last extension
	BatchFromRegex    = "regex"    // a capture group of the feed pattern
	BatchFromManifest = "manifest" // the manifest's batch_id
)

// Compressions a feed may accept.
const (
	CompressionGzip = "gzip" // <name>.gz
	CompressionZip  = "zip"  // <name>.zip holding exactly one file
)

// Column types.
const (
	TypeText      = "text"
	TypeInteger   = "integer"
	TypeDecimal   = "decimal"
	TypeDate      = "date"
	TypeTimestamp = "timestamp"
	TypeEnum      = "enum"
	TypeEmail     = "email"
)

// Encodings a feed may declare. The encoding is declared, never guessed.
const (
	EncodingUTF8        = "utf-8"        // a leading BOM is accepted
	EncodingISO88591    = "iso-8859-1"   // Latin-1: every byte is a character
	EncodingWindows1252 = "windows-1252" // the five undefined bytes are invalid
)

// Feed defaults.
const (
	DefaultChunkRows   = 10_000
	DefaultChunkBytes  = 8 << 20
	MinChunkBytes      = 1 << 20
	DefaultMaxFieldLen = 64 << 10
	DefaultTextMaxLen  = 4096
	DefaultDateLayout  = "2006-01-02"
	DefaultTimeLayout  = "2006-01-02T15:04:05Z07:00"
	// MaxIntegerDigits: an integer column holds a bigint (19 digits).
	MaxIntegerDigits = 19
	// MaxDecimalIntegerDigits is the most digits before the point the row
	// check accepts in a decimal without a precision.
	MaxDecimalIntegerDigits = 100
	// MaxDecimalDigits bounds a decimal's declared precision.
	MaxDecimalDigits    = 130
	maxBatchIDLen       = 128
	batchIDAllowedChars = `^[A-Za-z0-9][A-Za-z0-9._-]*$`
)

var batchIDPattern = regexp.MustCompile(batchIDAllowedChars)

// ValidBatchID reports whether s may be used as a batch id: it becomes part
// of archive and report names, so it is kept to a safe alphabet.
func ValidBatchID(s string) bool {
	return len(s) <= maxBatchIDLen && batchIDPattern.MatchString(s) && !strings.Contains(s, "..")
}

// Feed is one kind of file a partner sends.
type Feed struct {
	// Name identifies the feed in logs, metrics and the database.
	Name string `yaml:"name"`
	// Pattern is a Go regexp matched against the whole file name in ready/.
	Pattern string `yaml:"pattern"`
	// BatchID says where the batch id comes from.
	BatchID BatchIDRule `yaml:"batch_id"`
	// CSV is the declared dialect; it is never guessed.
	CSV Dialect `yaml:"csv"`
	// Columns in file order.
	Columns []Column `yaml:"columns"`
	// Key names the columns that identify a row, scoped by partner id.
	Key []string `yaml:"key"`
	// Target is the table rows land in (schema-qualified or not).
	Target string `yaml:"target"`
	// MaxRejectRatio: a file whose plan rejects more than this share of its
	// rows is quarantined for ops instead of applied. 0 uses the default;
	// 1 applies whatever is valid.
	MaxRejectRatio float64 `yaml:"max_reject_ratio"`
	// ChunkRows is how many rows one apply transaction covers.
	ChunkRows int `yaml:"chunk_rows"`
	// ChunkBytes bounds the values one chunk holds (default 8 MiB): a
	// chunk ends at chunk_rows rows or before the row that would take it
	// past chunk_bytes, so a chunk's memory is bounded by bytes too.
	ChunkBytes int64 `yaml:"chunk_bytes"`
	// Compression lists what compressed files the feed accepts ("gzip",
	// "zip"); none by default. The pattern must match the compressed name.
	Compression []string `yaml:"compression"`
	// Expect, when set, says when the feed's files are due; a delivery
	// window that closes without an accepted file is late (expect.go).
	Expect *Expect `yaml:"expect"`
	// Mode says what a file may do to the target's rows: upsert (default:
	// insert new keys, update changed rows), insert_only (an existing key
	// is a conflict, reason exists), update_only (a key the target does
	// not hold is rejected, reason not_found) or snapshot (upsert, and the
	// file is the partner's complete set: rows intake wrote for the
	// partner and feed whose key the file lacks are deleted, or marked in
	// DeletedAt, in the file's last transaction).
	Mode Mode `yaml:"mode"`
	// DeletedAt names a timestamptz (or timestamp) column of the target
	// that a snapshot sets on rows absent from the file instead of
	// deleting them; a row that comes back has it cleared.
	DeletedAt string `yaml:"deleted_at"`
	// OnOutsideEdit says what happens to a row edited outside intake since
	// intake last wrote it (the target needs the intake_row_hash column to
	// tell): keep (default: the row is a conflict, reason outside_edit,
	// and is not overwritten) or overwrite.
	OnOutsideEdit OutsideEdit `yaml:"on_outside_edit"`
	// PGP, when set, says the feed's files are OpenPGP messages encrypted
	// to intake's key (every file of the feed; a name ending in .pgp,
	// .gpg or .asc loses that ending for the stem batch id).
	PGP *PGP `yaml:"pgp"`
	// Approval, when set, says when a file's plan must be approved by a
	// human before it is applied (approval.go). It is no part of the
	// mapping (not in Hash): changing it re-plans nothing.
	Approval *Approval `yaml:"approval" json:"-"`
	// DeleteGuard bounds what a snapshot may delete before a human looks
	// (approval.go); every snapshot feed has one unless it says off. No
	// part of the mapping either.
	DeleteGuard *DeleteGuard `yaml:"delete_guard" json:"-"`

	re *regexp.Regexp
}

// Hash identifies the feed's mapping: the sha256, as JSON, of every
// setting that decides which rows a file's bytes become and how they are
// written (its dialect, columns, key, target, mode, chunking, batch id
// rule, compression, reject ratio), defaults filled. A file records the
// hash of the mapping that planned it, and is applied under that one
// only. When files are due (expect), how they are decrypted and to whom
// reports are sealed (pgp) and whether a plan waits for approval are no
// part of it: changing them re-plans or fails no file.
func (f *Feed) Hash() string {
	c := *f
	c.Expect, c.PGP = nil, nil
	return hashJSON(&c)
}

// SameMapping reports whether sha, a hash a file recorded, is this feed's
// mapping: Hash, or the hash of every setting this feed has (what files
// planned before Hash left out expect and pgp recorded).
func (f *Feed) SameMapping(sha string) bool {
	return sha == f.Hash() || sha == hashJSON(f)
}

func hashJSON(f *Feed) string {
	b, err := json.Marshal(f)
	if err != nil { // a Feed is plain data: cannot happen
		panic(fmt.Sprintf("feed %s: %v", f.Name, err))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Mode is a feed's import mode (Feed.Mode).
type Mode string

// Import modes.
const (
	ModeUpsert     Mode = "upsert"
	ModeInsertOnly Mode = "insert_only"
	ModeUpdateOnly Mode = "update_only"
	ModeSnapshot   Mode = "snapshot"
)

// OutsideEdit is what a feed does with a row edited outside intake
// (Feed.OnOutsideEdit).
type OutsideEdit string

// What a feed does with a row edited outside intake.
const (
	OutsideEditKeep      OutsideEdit = "keep"
	OutsideEditOverwrite OutsideEdit = "overwrite"
)

// BatchIDRule says where a file's batch id comes from.
type BatchIDRule struct {
	// From is "stem" (default), "regex" or "manifest".
	From string `yaml:"from"`
	// Group is the capture group of Pattern, for From = "regex".
	Group int `yaml:"group"`
}

// Dialect is a declared CSV dialect.
type Dialect struct {
	// Delimiter is one character; default ",".
	Delimiter string `yaml:"delimiter"`
	// Header: the first line names the columns (checked against Columns).
	Header *bool `yaml:"header"`
	// Encoding: "utf-8" (a BOM is allowed), "iso-8859-1" or "windows-1252".
	Encoding string `yaml:"encoding"`
	// MaxFieldBytes bounds one cell.
	MaxFieldBytes int `yaml:"max_field_bytes"`
	// MaxLineBytes bounds one physical line (default 4 MiB); a longer line
	// fails the file without being buffered whole.
	MaxLineBytes int `yaml:"max_line_bytes"`
	// MaxRecordBytes bounds one record, every physical line of it (quoted
	// fields spanning lines included); a longer record fails the file
	// (record_too_large) once it passes the bound, never buffered whole.
	// Default: the declared columns at max_field_bytes each, quotes
	// doubled, at least max_line_bytes, at most 16 MiB unless
	// max_line_bytes is larger (rows.RecordBytes).
	MaxRecordBytes int `yaml:"max_record_bytes"`
}

// HasHeader reports whether the first line is a header.
func (d Dialect) HasHeader() bool { return d.Header == nil || *d.Header }

// Column is one declared column.
type Column struct {
	Name     string `yaml:"name"`
	Type     string `yaml:"type"`
	Required bool   `yaml:"required"`
	// MaxLength bounds text, in characters.
	MaxLength int `yaml:"max_length"`
	// Scale is the most digits after the point, for decimal.
	Scale int `yaml:"scale"`
	// Precision is the most digits in all, for integer and decimal (as
	// PostgreSQL's numeric(precision, scale)); 0: unbounded (an integer
	// then fits a bigint, a decimal has up to 100 digits before the
	// point). `intake check` needs it to prove that a bounded target
	// column (numeric(p,s), integer, smallint) holds every accepted value.
	Precision int `yaml:"precision"`
	// Layout is a Go time layout, for date and timestamp.
	Layout string `yaml:"layout"`
	// Values are the allowed values, for enum.
	Values []string `yaml:"values"`
}

// SetDefaults fills unset fields.
func (f *Feed) SetDefaults() {
	setting.Default(&f.BatchID.From, BatchFromStem)
	setting.Default(&f.CSV.Delimiter, ",")
	setting.Default(&f.CSV.Encoding, EncodingUTF8)
	setting.Default(&f.CSV.MaxFieldBytes, DefaultMaxFieldLen)
	setting.Default(&f.MaxRejectRatio, DefaultMaxRejectRatio)
	setting.Default(&f.ChunkRows, DefaultChunkRows)
	setting.Default(&f.Mode, ModeUpsert)
	if f.Mode == ModeSnapshot && f.DeleteGuard == nil {
		f.DeleteGuard = &DeleteGuard{}
	}
	setting.Default(&f.OnOutsideEdit, OutsideEditKeep)
	setting.Default(&f.ChunkBytes, DefaultChunkBytes)
	for i := range f.Columns {
		c := &f.Columns[i]
		switch c.Type {
		case TypeText:
			setting.Default(&c.MaxLength, DefaultTextMaxLen)
		case TypeDate:
			setting.Default(&c.Layout, DefaultDateLayout)
		case TypeTimestamp:
			setting.Default(&c.Layout, DefaultTimeLayout)
		}
	}
}

// Validate reports the first problem, naming the key.
func (f *Feed) Validate(key, readiness string) error {
	if !names.Ident(f.Name) {
		return fmt.Errorf("%s.name: %q must match %s", key, f.Name, names.IdentRule)
	}
	key = fmt.Sprintf("%s (feed %s)", key, f.Name)
	if f.Pattern == "" {
		return fmt.Errorf("%s.pattern: required", key)
	}
	// The pattern must be a regexp by itself before it is anchored: a
	// pattern such as `a)|(?:b` is not one, but anchored by concatenation
	// it would compile as `^(?:a)|(?:b)$`, matching any name that starts
	// with a or ends with b rather than the whole name.
	if _, err := regexp.Compile(f.Pattern); err != nil {
		return fmt.Errorf("%s.pattern: %v", key, err)
	}
	re, err := regexp.Compile("^(?:" + f.Pattern + ")$")
	if err != nil {
		return fmt.Errorf("%s.pattern: %v", key, err)
	}
	f.re = re
	switch f.BatchID.From {
	case BatchFromStem:
	case BatchFromRegex:
		if f.BatchID.Group < 1 || f.BatchID.Group > re.NumSubexp() {
			return fmt.Errorf("%s.batch_id.group: %d is not a capture group of pattern (it has %d)", key, f.BatchID.Group, re.NumSubexp())
		}
	case BatchFromManifest:
		if readiness != ReadinessManifest {
			return fmt.Errorf("%s.batch_id.from: manifest needs the partner's readiness: manifest", key)
		}
	default:
		return fmt.Errorf("%s.batch_id.from: %q is not stem, regex or manifest", key, f.BatchID.From)
	}
	if utf8.RuneCountInString(f.CSV.Delimiter) != 1 || strings.ContainsAny(f.CSV.Delimiter, "\"\r\n") {
		return fmt.Errorf("%s.csv.delimiter: %q must be one character other than quote or newline", key, f.CSV.Delimiter)
	}
	switch f.CSV.Encoding {
	case EncodingUTF8, EncodingISO88591, EncodingWindows1252:
	default:
		return fmt.Errorf("%s.csv.encoding: %q is not supported (supported: %s, %s, %s)", key, f.CSV.Encoding,
			EncodingUTF8, EncodingISO88591, EncodingWindows1252)
	}
	if f.CSV.MaxFieldBytes < 1 {
		return fmt.Errorf("%s.csv.max_field_bytes: must be positive", key)
	}
	if f.CSV.MaxLineBytes < 0 || (f.CSV.MaxLineBytes > 0 && f.CSV.MaxLineBytes < f.CSV.MaxFieldBytes) {
		return fmt.Errorf("%s.csv.max_line_bytes: must be at least max_field_bytes", key)
	}
	if r := f.CSV.MaxRecordBytes; r < 0 || (r > 0 && (r < f.CSV.MaxFieldBytes || r < f.CSV.MaxLineBytes)) {
		return fmt.Errorf("%s.csv.max_record_bytes: must be at least max_field_bytes and max_line_bytes", key)
	}
	if !names.Target(f.Target) {
		return fmt.Errorf("%s.target: %q must be a lower-case table name, optionally schema-qualified", key, f.Target)
	}
	switch f.Mode {
	case ModeUpsert, ModeInsertOnly, ModeUpdateOnly, ModeSnapshot:
	default:
		return fmt.Errorf("%s.mode: %q is not upsert, insert_only, update_only or snapshot", key, f.Mode)
	}
	if f.DeletedAt != "" {
		if f.Mode != ModeSnapshot {
			return fmt.Errorf("%s.deleted_at: only a snapshot feed marks rows (mode: snapshot)", key)
		}
		if !names.Ident(f.DeletedAt) || f.Column(f.DeletedAt) != nil || f.DeletedAt == "partner_id" || f.DeletedAt == "last_intake_id" {
			return fmt.Errorf("%s.deleted_at: %q must name a target column the feed does not write", key, f.DeletedAt)
		}
	}
	switch f.OnOutsideEdit {
	case OutsideEditKeep, OutsideEditOverwrite:
	default:
		return fmt.Errorf("%s.on_outside_edit: %q is not keep or overwrite", key, f.OnOutsideEdit)
	}
	if err := f.Approval.validate(key + ".approval"); err != nil {
		return err
	}
	if f.DeleteGuard != nil && f.Mode != ModeSnapshot {
		return fmt.Errorf("%s.delete_guard: only a snapshot feed deletes (mode: snapshot)", key)
	}
	if err := f.DeleteGuard.validate(key + ".delete_guard"); err != nil {
		return err
	}
	if f.MaxRejectRatio < 0 || f.MaxRejectRatio > 1 {
		return fmt.Errorf("%s.max_reject_ratio: %v must be between 0 and 1", key, f.MaxRejectRatio)
	}
	if f.ChunkRows < 1 || f.ChunkRows > 1_000_000 {
		return fmt.Errorf("%s.chunk_rows: %d must be between 1 and 1000000", key, f.ChunkRows)
	}
	if f.ChunkBytes < MinChunkBytes || f.ChunkBytes > 1<<30 {
		return fmt.Errorf("%s.chunk_bytes: %d must be between %d and %d", key, f.ChunkBytes, MinChunkBytes, 1<<30)
	}
	if f.Expect != nil {
		if err := f.Expect.Validate(key + ".expect"); err != nil {
			return err
		}
	}
	if f.PGP != nil {
		if err := f.PGP.Validate(key + ".pgp"); err != nil {
			return err
		}
	}
	for _, c := range f.Compression {
		if c != CompressionGzip && c != CompressionZip {
			return fmt.Errorf("%s.compression: %q is not gzip or zip", key, c)
		}
	}
	if len(f.Columns) == 0 {
		return fmt.Errorf("%s.columns: at least one column is required", key)
	}
	seen := map[string]bool{}
	for i, c := range f.Columns {
		ckey := fmt.Sprintf("%s.columns[%d]", key, i)
		if !names.Ident(c.Name) {
			return fmt.Errorf("%s.name: %q must match %s", ckey, c.Name, names.IdentRule)
		}
		if reservedColumns[c.Name] {
			return fmt.Errorf("%s.name: %q is reserved for intake's bookkeeping", ckey, c.Name)
		}
		if seen[c.Name] {
			return fmt.Errorf("%s.name: %q appears twice", ckey, c.Name)
		}
		seen[c.Name] = true
		if err := c.validate(ckey); err != nil {
			return err
		}
	}
	if len(f.Key) == 0 {
		return fmt.Errorf("%s.key: name the columns that identify a row", key)
	}
	for _, k := range f.Key {
		if !seen[k] {
			return fmt.Errorf("%s.key: %q is not a declared column", key, k)
		}
		if c := f.Column(k); !c.Required {
			return fmt.Errorf("%s.key: key column %q must be required", key, k)
		}
	}
	return nil
}

// reservedColumns are intake's own columns in a target table.
var reservedColumns = map[string]bool{"partner_id": true, "last_intake_id": true, "line": true,
	"intake_t_last": true, "intake_is_new": true, "intake_differs": true}

func (c Column) validate(key string) error {
	switch c.Type {
	case TypeText:
		if c.MaxLength < 1 {
			return fmt.Errorf("%s.max_length: must be positive", key)
		}
	case TypeEmail:
	case TypeInteger:
		if c.Precision < 0 || c.Precision > MaxIntegerDigits {
			return fmt.Errorf("%s.precision: %d must be between 0 (unbounded) and %d", key, c.Precision, MaxIntegerDigits)
		}
	case TypeDecimal:
		if c.Scale < 0 || c.Scale > 30 {
			return fmt.Errorf("%s.scale: %d must be between 0 and 30", key, c.Scale)
		}
		if c.Precision != 0 && (c.Precision < max(c.Scale, 1) || c.Precision > MaxDecimalDigits) {
			return fmt.Errorf("%s.precision: %d must be 0 (unbounded) or between scale (%d) and %d", key, c.Precision, c.Scale, MaxDecimalDigits)
		}
	case TypeDate, TypeTimestamp:
		if c.Layout == "" {
			return fmt.Errorf("%s.layout: required for %s", key, c.Type)
		}
	case TypeEnum:
		if len(c.Values) == 0 {
			return fmt.Errorf("%s.values: an enum needs its allowed values", key)
		}
	default:
		return fmt.Errorf("%s.type: %q is not one of text, integer, decimal, date, timestamp, enum, email", key, c.Type)
	}
	if c.Precision != 0 && c.Type != TypeInteger && c.Type != TypeDecimal {
		return fmt.Errorf("%s.precision: only integer and decimal columns have a precision", key)
	}
	return nil
}

// IntegerDigits is the most digits before the point a value of the column
// may have (integer and decimal columns): its precision less its scale,
// or what the row check accepts when it has no precision.
func (c Column) IntegerDigits() int {
	switch {
	case c.Type == TypeInteger && c.Precision > 0:
		return c.Precision
	case c.Type == TypeInteger:
		return MaxIntegerDigits
	case c.Precision > 0:
		return c.Precision - c.Scale
	}
	return MaxDecimalIntegerDigits
}

// Column returns the named column, or nil.
func (f *Feed) Column(name string) *Column {
	for i := range f.Columns {
		if f.Columns[i].Name == name {
			return &f.Columns[i]
		}
	}
	return nil
}

// Allows reports whether the feed accepts a compression.
func (f *Feed) Allows(compression string) bool {
	for _, c := range f.Compression {
		if c == compression {
			return true
		}
	}
	return false
}

// Matches reports whether name belongs to this feed.
func (f *Feed) Matches(name string) bool { return f.re.MatchString(name) }

// BatchIDFromName derives the batch id from a file name for the stem and
// regex rules; for the manifest rule it returns "".
func (f *Feed) BatchIDFromName(name string) string {
	switch f.BatchID.From {
	case BatchFromStem:
		if ext := strings.ToLower(path.Ext(name)); (ext == ".gz" && f.Allows(CompressionGzip)) || (ext == ".zip" && f.Allows(CompressionZip)) {
			name = strings.TrimSuffix(name, path.Ext(name))
		}
		if ext := strings.ToLower(path.Ext(name)); f.PGP != nil && (ext == ".pgp" || ext == ".gpg" || ext == ".asc") {
			name = strings.TrimSuffix(name, path.Ext(name))
		}
		return strings.TrimSuffix(name, path.Ext(name))
	case BatchFromRegex:
		m := f.re.FindStringSubmatch(name)
		if m == nil {
			return ""
		}
		return m[f.BatchID.Group]
	}
	return ""
}
