package unwrap

import (
	"archive/zip"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"strings"
	"syscall"

	"github.com/partner-intake/partner-intake/internal/reason"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/spool"
)

// A zip may hold one file (and the directories above it): its central
// directory is refused beyond these bounds before archive/zip reads it,
// because archive/zip reads the whole directory into memory, one struct
// per entry, whatever the end record says.
const (
	maxZipEntries  = 64
	maxZipDirBytes = 256 << 10
)

// CompressionOf names the compression a file's name declares.
func CompressionOf(name string) string {
	switch strings.ToLower(path.Ext(name)) {
	case ".gz":
		return partners.CompressionGzip
	case ".zip":
		return partners.CompressionZip
	}
	return ""
}

var (
	gzipMagic = []byte{0x1f, 0x8b}
	zipMagic  = []byte("PK\x03\x04")
)

// spooled is the spooled original as expand reads it.
type spooled interface {
	io.Reader
	io.ReaderAt
}

// corrupt: err says the bytes are not a readable archive (the partner's
// file), not that they could not be read or written (the spool's disk,
// retried). Told by the errors' kinds, never by their text, which names
// local paths and the partner's id.
func corrupt(err error) bool {
	var ce flate.CorruptInputError
	var ie flate.InternalError
	return errors.Is(err, gzip.ErrChecksum) || errors.Is(err, gzip.ErrHeader) || errors.Is(err, zip.ErrChecksum) ||
		errors.Is(err, zip.ErrFormat) || errors.Is(err, zip.ErrAlgorithm) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ce) || errors.As(err, &ie)
}

// expand streams the compressed file f (spooled as orig) of kind
// expanded into the spool.
func (j Job) expand(f spooled, kind string, orig spool.Entry) (spool.Entry, *Held, error) {
	max := j.MaxBytes
	ratio := j.MaxRatio
	put := func(src io.Reader) (spool.Entry, *Held, error) {
		e, nested, err := j.putWatched(max, ratioLimit(orig.Size, ratio), src)
		switch {
		case errors.Is(err, spool.ErrTooLarge):
			return e, &Held{reason.ArchiveTooLarge, fmt.Sprintf("it expands to more than %d bytes", max)}, nil
		case errors.Is(err, errExpansionRatio):
			return e, &Held{reason.ArchiveTooLarge, fmt.Sprintf("it expands to more than %d times its %d compressed bytes (limits.max_expansion_ratio)", ratio, orig.Size)}, nil
		case errors.Is(err, errSpoolLow):
			return e, nil, err // the disk's, not the file's: retried later
		case err != nil && corrupt(err):
			return e, &Held{reason.ArchiveInvalid, "the compressed data is corrupt"}, nil
		case err != nil:
			return e, nil, err
		case nested:
			// its expanded copy was spooled whole: it leaves again (not
			// when it is the original's own bytes, a gzip quine)
			if j.DropPlain != nil && e.SHA256 != orig.SHA256 {
				j.DropPlain(e)
			}
			return e, &Held{reason.ArchiveNested, "the expanded file is itself compressed"}, nil
		}
		return e, nil, nil
	}
	switch kind {
	case partners.CompressionGzip:
		zr, err := gzip.NewReader(f)
		if err != nil && !corrupt(err) {
			return orig, nil, fmt.Errorf("expand: read the spooled file: %w", err)
		}
		if err != nil {
			return orig, &Held{reason.ArchiveInvalid, "not a gzip file"}, nil
		}
		defer zr.Close()
		return put(zr)
	default:
		if held, err := zipBounded(f, orig.Size); held != nil || err != nil {
			return orig, held, err
		}
		zr, err := zip.NewReader(f, orig.Size)
		if err != nil && !corrupt(err) {
			return orig, nil, fmt.Errorf("expand: read the spooled file: %w", err)
		}
		if err != nil {
			return orig, &Held{reason.ArchiveInvalid, "not a zip file"}, nil
		}
		var entry *zip.File
		for _, zf := range zr.File {
			name := zf.Name
			if zf.Mode()&os.ModeSymlink != 0 {
				return orig, &Held{reason.ArchiveSymlink, "an entry is a symbolic link"}, nil
			}
			if !safeEntry(name) {
				return orig, &Held{reason.ArchiveBadEntry, "an entry name has '..', an absolute path or unsafe characters"}, nil
			}
			if strings.HasSuffix(name, "/") {
				continue // a directory entry
			}
			if entry != nil {
				return orig, &Held{reason.ArchiveEntries, fmt.Sprintf("it holds %d or more files; one is allowed", 2)}, nil
			}
			entry = zf
		}
		if entry == nil {
			return orig, &Held{reason.ArchiveEntries, "it holds no file"}, nil
		}
		if CompressionOf(entry.Name) != "" {
			return orig, &Held{reason.ArchiveNested, "the entry is itself an archive"}, nil
		}
		if entry.UncompressedSize64 > uint64(max) {
			return orig, &Held{reason.ArchiveTooLarge, fmt.Sprintf("its entry declares %d bytes, more than %d", entry.UncompressedSize64, max)}, nil
		}
		rc, err := entry.Open()
		if err != nil && !corrupt(err) {
			return orig, nil, fmt.Errorf("expand: read the spooled file: %w", err)
		}
		if err != nil {
			return orig, &Held{reason.ArchiveInvalid, "the entry cannot be read"}, nil
		}
		defer rc.Close()
		return put(rc)
	}
}

// safeEntry: a relative name, every element a safe name, no "..".
func safeEntry(name string) bool {
	if name == "" || strings.HasPrefix(name, "/") || strings.Contains(name, "\\") || len(name) > 1024 {
		return false
	}
	for _, el := range strings.Split(strings.TrimSuffix(name, "/"), "/") {
		if el == ".." || el == "." || !partners.SafeName(el) {
			return false
		}
	}
	return true
}

// errExpansionRatio: the expanded bytes passed limits.max_expansion_ratio
// times the compressed bytes.
var errExpansionRatio = errors.New("expansion ratio exceeded")

// errSpoolLow: the spool's disk fell below spool.min_free_bytes while a
// file expanded into it. It wraps ENOSPC, so the run counts it transient:
// the file is retried later, not held.
var errSpoolLow = fmt.Errorf("spool disk below its free-space floor while expanding: %w", syscall.ENOSPC)

// expandFreeEvery is how many expanded bytes are written between two
// looks at the spool's free space (one statfs each).
const expandFreeEvery = 4 << 20

// putWatched streams src into the spool, at most max bytes, through the
// expansion watch (limit: the ratio's bound, 0 none; the spool's free
// space) and the nested-archive watch: nested, the bytes begin as a
// compressed file does. Expanding and decrypting both spool so.
func (j Job) putWatched(max, limit int64, src io.Reader) (e spool.Entry, nested bool, err error) {
	nw := &nestWatch{}
	ew := &expandWatch{limit: limit, free: j.Spool.FreeBytes, minFree: j.MinFree}
	e, err = j.put(max, func(w io.Writer) (int64, error) {
		return io.Copy(io.MultiWriter(ew, w, nw), src)
	})
	return e, nw.nested(), err
}

// ratioLimit is the most bytes a file of compressed bytes may expand to
// at ratio (0: no limit).
func ratioLimit(compressed, ratio int64) int64 {
	if ratio <= 0 || compressed <= 0 || compressed > math.MaxInt64/ratio {
		return 0
	}
	return compressed * ratio
}

// expandWatch sits before the spool in an expansion's writers: past limit
// bytes (0: none) it stops the stream with errExpansionRatio; at the first
// write and every expandFreeEvery bytes after it asks free for the spool
// disk's free space and stops with errSpoolLow below minFree.
type expandWatch struct {
	limit   int64
	free    func() (uint64, error)
	minFree int64

	written, nextLook int64
}

func (w *expandWatch) Write(p []byte) (int, error) {
	w.written += int64(len(p))
	if w.limit > 0 && w.written > w.limit {
		return 0, errExpansionRatio
	}
	if w.free != nil && w.written > w.nextLook {
		w.nextLook = w.written + expandFreeEvery
		free, err := w.free()
		if err != nil {
			return 0, fmt.Errorf("spool free space: %w", err)
		}
		if free < uint64(w.minFree) {
			return 0, fmt.Errorf("%w (%d bytes free, spool.min_free_bytes %d)", errSpoolLow, free, w.minFree)
		}
	}
	return len(p), nil
}

// nestWatch keeps the first bytes written, to spot an archive inside.
type nestWatch struct{ head []byte }

func (n *nestWatch) Write(p []byte) (int, error) {
	if len(n.head) < 4 {
		n.head = append(n.head, p[:min(len(p), 4-len(n.head))]...)
	}
	return len(p), nil
}

func (n *nestWatch) nested() bool {
	return bytes.HasPrefix(n.head, gzipMagic) || bytes.HasPrefix(n.head, zipMagic)
}

// zipBounded checks a zip's end-of-central-directory record (zip64 too)
// before archive/zip reads the directory: at most maxZipEntries entries in
// at most maxZipDirBytes, and the directory must end where the end
// records begin. archive/zip reads directory headers from the directory's
// start until one does not parse, whatever the declared count and size;
// with the end records right after the declared directory it stops there,
// so what it reads is bounded by the declared size. The end record is
// found the way archive/zip finds it (the last signature in the last
// 65 KiB; zip64 through its locator); a file whose end archive/zip would
// not find or read is left to archive/zip to refuse.
func zipBounded(f io.ReaderAt, size int64) (*Held, error) {
	const eocdLen, locLen, eocd64Len = 22, 20, 56
	tail := min(size, 65*1024)
	buf := make([]byte, tail)
	if _, err := f.ReadAt(buf, size-tail); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("expand: read zip end: %w", err)
	}
	at := -1
	for i := len(buf) - eocdLen; i >= 0; i-- {
		if bytes.Equal(buf[i:i+4], []byte("PK\x05\x06")) {
			if i+eocdLen+int(binary.LittleEndian.Uint16(buf[i+20:])) <= len(buf) {
				at = i
			}
			break
		}
	}
	if at < 0 {
		return nil, nil
	}
	end := size - tail + int64(at) // offset of the end record
	e := buf[at:]
	entries := uint64(binary.LittleEndian.Uint16(e[10:]))
	dirSize := uint64(binary.LittleEndian.Uint32(e[12:]))
	dirOff := uint64(binary.LittleEndian.Uint32(e[16:]))
	dirEnd := uint64(end)
	if (entries == 0xffff || dirSize == 0xffff || dirOff == 0xffffffff) && end >= locLen {
		// zip64 when the locator right before the end record says so
		loc := make([]byte, locLen)
		if _, err := f.ReadAt(loc, end-locLen); err != nil {
			return nil, nil
		}
		if bytes.Equal(loc[:4], []byte("PK\x06\x07")) && binary.LittleEndian.Uint32(loc[4:]) == 0 && binary.LittleEndian.Uint32(loc[16:]) == 1 {
			off := binary.LittleEndian.Uint64(loc[8:])
			rec := make([]byte, eocd64Len)
			if off > uint64(size) {
				return nil, nil
			}
			if _, err := f.ReadAt(rec, int64(off)); err != nil || !bytes.Equal(rec[:4], []byte("PK\x06\x06")) {
				return nil, nil
			}
			entries = binary.LittleEndian.Uint64(rec[32:])
			dirSize = binary.LittleEndian.Uint64(rec[40:])
			dirOff = binary.LittleEndian.Uint64(rec[48:])
			dirEnd = off
		}
	}
	switch {
	case entries > maxZipEntries:
		return &Held{reason.ArchiveDirectory, fmt.Sprintf("it lists %d entries; at most %d are read", entries, maxZipEntries)}, nil
	case dirSize > maxZipDirBytes:
		return &Held{reason.ArchiveDirectory, fmt.Sprintf("its central directory is %d bytes; at most %d are read", dirSize, maxZipDirBytes)}, nil
	case dirOff > dirEnd || dirOff+dirSize != dirEnd:
		return &Held{reason.ArchiveInvalid, "the central directory does not end where its end record begins"}, nil
	}
	return nil, nil
}
