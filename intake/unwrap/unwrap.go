// Package unwrap turns a spooled file's bytes into the bytes its rows come
// from: a gzip or zip file expanded, an OpenPGP message decrypted and its
// signature checked, each streamed from the spooled original into the
// spool under its own hash and bounded while it streams (expanded size,
// expansion ratio, the spool's free-space floor, a zip's central
// directory, the packets before a message's encrypted data). What a file
// is held for is a Held (a reason code and words that quote no content);
// the pipeline's fetch stage records it.
package unwrap

import (
	"fmt"
	"io"

	"github.com/partner-intake/partner-intake/internal/reason"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/spool"
)

// Held says why a file's bytes are not unwrapped: the reason code the file
// is held for, and a detail in words that quote none of its bytes.
type Held struct {
	Reason reason.Code
	Detail string
}

// Job is one file's unwrapping: the spool its bytes are in and go to, and
// the bounds they are held to.
type Job struct {
	Spool   *spool.Spool
	Partner string
	Feed    *partners.Feed // nil: no feed matches the file
	Name    string         // the file's remote name
	// MaxBytes caps the unwrapped bytes (limits.max_expanded_bytes),
	// MaxRatio the expanded bytes over the compressed bytes
	// (limits.max_expansion_ratio; 0: none), MinFree the spool disk's
	// free space while they stream (spool.min_free_bytes).
	MaxBytes, MaxRatio, MinFree int64
	// DropPlain removes a held file's plaintext from the spool once its
	// decryption held it (the signature is known only at its end).
	DropPlain func(spool.Entry)
	// Follow, when set, is given to the spool with the unwrapped bytes
	// (spool.Follow: their rows read as they land), and Landed is told
	// what the spool made of them, or its failure.
	Follow spool.PutOption
	Landed func(spool.Entry, error)
	// Unkept, with Follow: the unwrapped bytes go to the follower alone
	// and not into the spool (spool.Unkept), for a follower that reads
	// them all in that pass; a later reader has them made again from the
	// spooled original (the pipeline's ensureSpooled).
	Unkept bool
}

// put writes the unwrapped bytes src writes into the spool, followed when
// the job says so.
func (j Job) put(max int64, src func(io.Writer) (int64, error)) (spool.Entry, error) {
	var opts []spool.PutOption
	if j.Follow != nil {
		opts = append(opts, j.Follow)
		if j.Unkept {
			opts = append(opts, spool.Unkept())
		}
	}
	e, err := j.Spool.Put(j.Partner, -1, max, src, opts...)
	if j.Landed != nil {
		j.Landed(e, err)
	}
	return e, err
}

// Run returns the bytes rows come from: for a compressed file (when its
// feed allows that compression) the expanded bytes, streamed from the
// spooled original orig into the spool under their own hash, with the
// expanded size capped while streaming (headers are not trusted); for a
// file of a feed with pgp the plaintext; the original is kept. A file
// that is not compressed is its own data.
func (j Job) Run(orig spool.Entry) (spool.Entry, *Held, error) {
	kind := Kind(j.Feed, j.Name)
	if kind == "" {
		return orig, nil, nil
	}
	if kind != KindPGP && !j.Feed.Allows(kind) {
		return orig, &Held{reason.CompressionNotAllowed, fmt.Sprintf("the feed does not accept %s files", kind)}, nil
	}
	f, err := j.Spool.Open(j.Partner, orig.SHA256)
	if err != nil {
		return orig, nil, fmt.Errorf("expand: %w", err)
	}
	defer f.Close()
	if kind == KindPGP {
		return j.RunOn(f)
	}
	return j.expand(f, kind, orig)
}

// Streams reports whether the job's bytes are unwrapped in one pass from
// their first byte (RunOn), so the unwrapping can follow the original's
// download instead of waiting for its end: an OpenPGP message is. A zip
// is read from its central directory at the end, and a compressed file
// is bounded by its ratio to the whole original.
func (j Job) Streams() bool { return Kind(j.Feed, j.Name) == KindPGP }

// RunOn is Run for a job that Streams, on the original's bytes as src
// reads them (a spool.Follower of its download): a read error of src is
// the job's error, never the file's hold.
func (j Job) RunOn(src io.Reader) (spool.Entry, *Held, error) { return j.decrypt(src) }

// KindPGP: a file of a feed with pgp is an OpenPGP message, decrypted into
// the spool the way a compressed file is expanded.
const KindPGP = "pgp"

// Kind names what turns a file's bytes into the bytes rows come from: PGP
// for every file of a feed with pgp, else the compression its name
// declares, else "" (the file is its own data).
func Kind(feed *partners.Feed, name string) string {
	if feed != nil && feed.PGP != nil {
		return KindPGP
	}
	return CompressionOf(name)
}
