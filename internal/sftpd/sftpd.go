// Package sftpd is a small in-process SFTP server (pkg/sftp's request
// server on x/crypto/ssh) that serves one local folder per user. The demo
// uses it as the partners' drop site, and fast SFTP-only tests may. It
// behaves like OpenSSH where intake relies on it: RENAME never overwrites,
// and listings describe symlinks as symlinks (lstat), never following them.
package sftpd

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"
)

// Server serves SFTP on a loopback listener.
type Server struct {
	ln    net.Listener
	cfg   *ssh.ServerConfig
	roots map[string]string // user -> folder
	keys  map[string]string // user -> authorized key (wire format)
	log   *slog.Logger
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]bool
	done  bool
	quirks
}

// quirks are how this server departs from OpenSSH's, each armed by a
// test or the demo (none by default): the behaviours of other servers and
// gateways intake must cope with.
type quirks struct {
	// one: each connection starts one sftp subsystem, its first request's
	// (OneSubsystemPerConnection)
	one atomic.Bool
	// short: the most bytes a READ answers with (ShortReads); 0: all asked
	short atomic.Int64
	// lie rewrites the answers of listings and stats (Lie)
	lie atomic.Pointer[LieFunc]
	// hang: what of a channel's start goes unanswered (HangChannels)
	hang atomic.Int32
	// alive: keepalives sent on each channel before its SFTP is served
	// (ChannelKeepalives)
	alive atomic.Int32
	// overwrite: RENAME replaces an existing target (RenameOverwrites)
	overwrite atomic.Bool
	// copies: RENAME stamps the target with the time of the rename
	// (RenameCopies)
	copies atomic.Bool
	// nocase: a stat finds a name by another case (CaseInsensitiveStat)
	nocase atomic.Bool
	// vanish: directories exist only while they hold something
	// (EmptyDirsVanish)
	vanish atomic.Bool
	// mtimes: what a file's modification time is answered as
	// (StampMTimes)
	mtimes atomic.Pointer[func(time.Time) time.Time]
	// mute: global requests are never answered (MuteGlobalRequests)
	mute atomic.Bool
	// linger: a channel whose SFTP ended stays open (LingerChannels)
	linger atomic.Bool
	// refuse: the RENAMEs refused (RefuseRenames)
	refuse atomic.Pointer[func(from string) bool]
	// handles: the most files one SFTP session holds open at once
	// (MaxHandles); 0: no limit
	handles atomic.Int32
}

// MaxHandles makes the server refuse (failure) an OPEN while a session
// holds n files open, as servers that bound a session's handles do.
func (s *quirks) MaxHandles(n int) { s.handles.Store(int32(n)) }

// RefuseRenames makes the server refuse (permission denied) every RENAME
// whose source path f reports, as a site does for a file its user may
// not move (a permission, an immutable file, a gateway that cannot
// rename a folder). nil renames everything again.
func (s *quirks) RefuseRenames(f func(from string) bool) {
	if f == nil {
		s.refuse.Store(nil)
		return
	}
	s.refuse.Store(&f)
}

// LingerChannels makes the server keep a channel open after its client
// ended the channel's SFTP (sent EOF), until the connection ends: the
// client's wait for the channel's end waits on.
func (s *quirks) LingerChannels() { s.linger.Store(true) }

// openChannel is a channel the SFTP server's end leaves open
// (LingerChannels).
type openChannel struct{ ssh.Channel }

func (openChannel) Close() error { return nil }

// MuteGlobalRequests makes the server leave every global request
// unanswered, even one that wants a reply (RFC 4254 says a server
// answers each, if only with a failure; some embedded servers do not):
// a keepalive@openssh.com sent as one never returns.
func (s *quirks) MuteGlobalRequests() { s.mute.Store(true) }

// StampMTimes makes the server answer every regular file's modification
// time as f makes it of the true one, as servers that keep times of their
// own do: an object store's gateway stamps an upload's start or its end
// (whatever the client writes or sets in between), others keep whole
// seconds or minutes. nil answers the truth again.
func (s *quirks) StampMTimes(f func(time.Time) time.Time) {
	if f == nil {
		s.mtimes.Store(nil)
		return
	}
	s.mtimes.Store(&f)
}

// CaseInsensitiveStat makes the server's STAT and LSTAT of a name that
// does not exist answer for an entry of its directory whose name differs
// only by case, as a case-insensitive server (Windows, some gateways)
// does. Other requests keep the names as they are.
func (s *quirks) CaseInsensitiveStat() { s.nocase.Store(true) }

// EmptyDirsVanish makes directories exist only while they hold an entry,
// as on an object store's gateway (a directory is the prefix of the names
// it holds): an empty one is gone as soon as an operation leaves it empty,
// a MKDIR succeeds and makes nothing, and writing or renaming a file into
// a directory that is not there makes it.
func (s *quirks) EmptyDirsVanish() { s.vanish.Store(true) }

// RenameOverwrites makes the server's RENAME replace an existing target,
// as object-store gateways and some SFTP servers do (OpenSSH's refuses).
func (s *quirks) RenameOverwrites() { s.overwrite.Store(true) }

// RenameCopies makes the server's RENAME stamp the renamed file with the
// time of the rename, as a gateway whose RENAME is a copy and a delete
// does (AWS Transfer Family over S3: the copy is a new object, its mtime
// the copy's).
func (s *quirks) RenameCopies() { s.copies.Store(true) }

// What of a channel's start a hanging server leaves unanswered
// (HangChannels).
const (
	HangNothing   = 0
	HangOpen      = 1 // the channel's open: neither confirmed nor refused
	HangSubsystem = 2 // the subsystem request on a confirmed channel
	HangInit      = 3 // SFTP's version request, on a started subsystem
)

// HangChannels makes the server leave part of every channel's start
// unanswered from now on (HangOpen, HangSubsystem, HangInit; HangNothing
// ends it), while it goes on answering the connection's other requests
// (keepalives) and the channels already started: a site whose sshd no
// longer starts sessions.
func (s *quirks) HangChannels(what int) { s.hang.Store(int32(what)) }

// ChannelKeepalives makes the server send n keepalive@openssh.com
// requests on every session channel once its subsystem starts, before it
// serves SFTP there: what OpenSSH's ClientAliveInterval sends on a
// connection's first open channel, one an interval. All but the last go
// out at once without waiting for a reply, more than x/crypto/ssh holds
// unread on a channel before its connection stops reading; the last
// waits for its reply.
func (s *quirks) ChannelKeepalives(n int) { s.alive.Store(int32(n)) }

// LieFunc rewrites what the server answers a listing ("List"), a "Stat"
// or an "Lstat" of p with, given the true entries: tests of what a broken
// or hostile server sends (names with '/', sizes of 2^63 bytes or more,
// a listing that never ends). nil answers the truth.
type LieFunc func(method, p string, truth []os.FileInfo) sftp.ListerAt

// Lie makes the server answer listings and stats through f (nil: the
// truth again).
func (s *quirks) Lie(f LieFunc) {
	if f == nil {
		s.lie.Store(nil)
		return
	}
	s.lie.Store(&f)
}

// OneSubsystemPerConnection makes the server start one sftp subsystem per
// connection and refuse the next ones, as some SFTP servers do.
func (s *quirks) OneSubsystemPerConnection() { s.one.Store(true) }

// ShortReads makes the server answer every READ with at most n bytes, as
// SFTP allows (a short read); 0 answers with all the bytes asked for.
func (s *quirks) ShortReads(n int) { s.short.Store(int64(n)) }

// User is one login: its authorized public key and the folder it sees as /.
type User struct {
	Name string
	Key  ssh.PublicKey
	Root string
}

// Start listens on addr (e.g. 127.0.0.1:0) with the given host key.
func Start(addr string, hostKey ssh.Signer, users []User, log *slog.Logger) (*Server, error) {
	s := &Server{roots: map[string]string{}, keys: map[string]string{}, log: log, conns: map[net.Conn]bool{}}
	for _, u := range users {
		abs, err := filepath.Abs(u.Root)
		if err != nil {
			return nil, err
		}
		s.roots[u.Name] = abs
		s.keys[u.Name] = string(u.Key.Marshal())
	}
	s.cfg = &ssh.ServerConfig{
		PublicKeyCallback: func(c ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if want, ok := s.keys[c.User()]; ok && want == string(key.Marshal()) {
				return &ssh.Permissions{}, nil
			}
			return nil, fmt.Errorf("unknown key for %q", c.User())
		},
	}
	s.cfg.AddHostKey(hostKey)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s.ln = ln
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr is the listening address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops listening, closes every connection and waits for them.
func (s *Server) Close() error {
	s.mu.Lock()
	s.done = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.done {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serve(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

func (s *Server) serve(c net.Conn) {
	defer c.Close()
	sc, chans, reqs, err := ssh.NewServerConn(c, s.cfg)
	if err != nil {
		return
	}
	defer sc.Close()
	go func() {
		for req := range reqs {
			if req.WantReply && !s.mute.Load() {
				req.Reply(false, nil)
			}
		}
	}()
	root := s.roots[sc.User()]
	var started atomic.Int32 // sftp subsystems started on the connection
	var wg sync.WaitGroup
	defer wg.Wait()
	for nc := range chans {
		if nc.ChannelType() != "session" {
			nc.Reject(ssh.UnknownChannelType, "only session channels")
			continue
		}
		hang := s.hang.Load()
		if hang == HangOpen {
			continue // never confirmed nor refused
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer ch.Close()
			for req := range creqs {
				if hang == HangSubsystem {
					continue // never answered
				}
				ok := req.Type == "subsystem" && len(req.Payload) >= 4 && string(req.Payload[4:]) == "sftp"
				ok = ok && (started.Add(1) == 1 || !s.one.Load())
				req.Reply(ok, nil)
				if !ok {
					continue
				}
				if hang == HangInit {
					io.Copy(io.Discard, ch) // read, never answered
					return
				}
				for i := range s.alive.Load() {
					if _, err := ch.SendRequest("keepalive@openssh.com", i == s.alive.Load()-1, nil); err != nil {
						return
					}
				}
				h := &handler{root: root, short: &s.short, lie: &s.lie, overwrite: &s.overwrite, copies: &s.copies, nocase: &s.nocase, vanish: &s.vanish, mtimes: &s.mtimes, refuse: &s.refuse,
					maxOpen: &s.handles, open: new(atomic.Int32)}
				var rwc io.ReadWriteCloser = ch
				if s.linger.Load() {
					rwc = openChannel{ch}
				}
				srv := sftp.NewRequestServer(rwc, sftp.Handlers{FileGet: h, FilePut: h, FileCmd: h, FileList: h})
				if err := srv.Serve(); err != nil && !errors.Is(err, io.EOF) {
					s.log.Debug("sftp session ended", "err", err)
				}
				srv.Close()
				if s.linger.Load() {
					sc.Wait()
				}
				return
			}
		}()
	}
}

// handler maps SFTP paths into root, lexically confined to it.
type handler struct {
	root      string
	short     *atomic.Int64 // Server.ShortReads
	lie       *atomic.Pointer[LieFunc]
	overwrite *atomic.Bool // Server.RenameOverwrites
	copies    *atomic.Bool // Server.RenameCopies
	nocase    *atomic.Bool // Server.CaseInsensitiveStat
	vanish    *atomic.Bool // Server.EmptyDirsVanish
	mtimes    *atomic.Pointer[func(time.Time) time.Time]
	refuse    *atomic.Pointer[func(from string) bool] // Server.RefuseRenames
	maxOpen   *atomic.Int32                           // Server.MaxHandles
	open      *atomic.Int32                           // files this session holds open
}

// opened counts a file the session opens, or refuses it past
// Server.MaxHandles.
func (h *handler) opened() error {
	if n := h.open.Add(1); h.maxOpen.Load() > 0 && n > h.maxOpen.Load() {
		h.open.Add(-1)
		return sftp.ErrSSHFxFailure
	}
	return nil
}

// counted is an open file of a session: its Close (pkg/sftp's, when the
// client closes the handle) gives its count back once.
type counted struct {
	*os.File
	open *atomic.Int32
	once sync.Once
}

func (c *counted) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.File.Close()
}

// prune removes p and its parents below the root while they are empty
// (EmptyDirsVanish).
func (h *handler) prune(p string) {
	if !h.vanish.Load() {
		return
	}
	for p != h.root && strings.HasPrefix(p, h.root+string(filepath.Separator)) {
		if unix.Rmdir(p) != nil {
			return
		}
		p = filepath.Dir(p)
	}
}

// parentsFor makes the directories a file written or renamed to p needs
// (EmptyDirsVanish: a prefix needs no directory made first).
func (h *handler) parentsFor(p string) error {
	if !h.vanish.Load() {
		return nil
	}
	return os.MkdirAll(filepath.Dir(p), 0o755)
}

// stat is os.Stat or os.Lstat of p; under CaseInsensitiveStat a name
// that does not exist is looked up by case-folded equality in its
// directory.
func (h *handler) stat(p string, fn func(string) (os.FileInfo, error)) (os.FileInfo, error) {
	st, err := fn(p)
	if err == nil || !h.nocase.Load() || !errors.Is(err, os.ErrNotExist) {
		return st, err
	}
	ents, rerr := os.ReadDir(filepath.Dir(p))
	if rerr != nil {
		return nil, err
	}
	for _, e := range ents {
		if strings.EqualFold(e.Name(), filepath.Base(p)) {
			return fn(filepath.Join(filepath.Dir(p), e.Name()))
		}
	}
	return nil, err
}

// answer is the truth, its files' times stamped (StampMTimes), or what
// Lie makes of it.
func (h *handler) answer(method, p string, truth Entries) sftp.ListerAt {
	if f := h.mtimes.Load(); f != nil {
		stamped := make(Entries, len(truth))
		for i, fi := range truth {
			if fi.Mode().IsRegular() {
				fi = stampedInfo{fi, (*f)(fi.ModTime())}
			}
			stamped[i] = fi
		}
		truth = stamped
	}
	if f := h.lie.Load(); f != nil {
		return (*f)(method, p, truth)
	}
	return truth
}

func (h *handler) local(p string) (string, error) {
	clean := path.Clean("/" + p)
	full := filepath.Join(h.root, filepath.FromSlash(clean))
	if full != h.root && !strings.HasPrefix(full, h.root+string(filepath.Separator)) {
		return "", os.ErrPermission
	}
	return full, nil
}

func (h *handler) Fileread(r *sftp.Request) (io.ReaderAt, error) {
	p, err := h.local(r.Filepath)
	if err != nil {
		return nil, err
	}
	if err := h.opened(); err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		h.open.Add(-1)
		return nil, err
	}
	c := &counted{File: f, open: h.open}
	if n := h.short.Load(); n > 0 {
		return shortReader{c, int(n)}, nil
	}
	return c, nil
}

// shortReader reads at most n bytes a call (Server.ShortReads); pkg/sftp
// closes the file through Close.
type shortReader struct {
	*counted
	n int
}

func (s shortReader) ReadAt(p []byte, off int64) (int, error) {
	return s.counted.ReadAt(p[:min(len(p), s.n)], off)
}

func (h *handler) Filewrite(r *sftp.Request) (io.WriterAt, error) {
	p, err := h.local(r.Filepath)
	if err != nil {
		return nil, err
	}
	fl := r.Pflags()
	flags := os.O_WRONLY
	if fl.Creat {
		flags |= os.O_CREATE
	}
	if fl.Trunc {
		flags |= os.O_TRUNC
	}
	if fl.Excl {
		flags |= os.O_EXCL
	}
	if fl.Append {
		flags |= os.O_APPEND
	}
	if fl.Creat {
		if err := h.parentsFor(p); err != nil {
			return nil, err
		}
	}
	if err := h.opened(); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(p, flags, 0o644)
	if err != nil {
		h.open.Add(-1)
		return nil, err
	}
	return &counted{File: f, open: h.open}, nil
}

func (h *handler) Filecmd(r *sftp.Request) error {
	p, err := h.local(r.Filepath)
	if err != nil {
		return err
	}
	switch r.Method {
	case "Rename":
		if f := h.refuse.Load(); f != nil && (*f)(r.Filepath) {
			return os.ErrPermission
		}
		t, err := h.local(r.Target)
		if err != nil {
			return err
		}
		if err := h.parentsFor(t); err != nil {
			return err
		}
		defer h.prune(filepath.Dir(p))
		if h.overwrite.Load() {
			err = os.Rename(p, t)
		} else {
			// Like OpenSSH's SSH_FXP_RENAME: fail when the target exists.
			err = unix.Renameat2(unix.AT_FDCWD, p, unix.AT_FDCWD, t, unix.RENAME_NOREPLACE)
		}
		if err == nil && h.copies.Load() {
			now := time.Now()
			err = os.Chtimes(t, now, now)
		}
		return err
	case "Remove":
		st, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if st.IsDir() {
			return errors.New("is a directory")
		}
		defer h.prune(filepath.Dir(p))
		return os.Remove(p)
	case "Rmdir":
		defer h.prune(filepath.Dir(p))
		return unix.Rmdir(p)
	case "Mkdir":
		if h.vanish.Load() {
			// a prefix: nothing to make, and no parent needed
			if st, err := os.Lstat(p); err == nil && !st.IsDir() {
				return os.ErrExist
			}
			return nil
		}
		return os.Mkdir(p, 0o755)
	case "Setstat":
		if r.AttrFlags().Size {
			if err := os.Truncate(p, int64(r.Attributes().Size)); err != nil {
				return err
			}
		}
		if r.AttrFlags().Acmodtime {
			// times set are kept, in whole seconds (SFTP v3), as OpenSSH's
			a := r.Attributes()
			return os.Chtimes(p, time.Unix(int64(a.Atime), 0), time.Unix(int64(a.Mtime), 0))
		}
		return nil
	}
	return sftp.ErrSSHFxOpUnsupported
}

func (h *handler) Filelist(r *sftp.Request) (sftp.ListerAt, error) {
	p, err := h.local(r.Filepath)
	if err != nil {
		return nil, err
	}
	switch r.Method {
	case "List":
		ents, err := os.ReadDir(p)
		if err != nil {
			return nil, err
		}
		out := make(Entries, 0, len(ents))
		for _, e := range ents {
			if info, err := e.Info(); err == nil { // lstat: symlinks stay symlinks
				out = append(out, info)
			}
		}
		return h.answer("List", r.Filepath, out), nil
	case "Stat":
		st, err := h.stat(p, os.Stat)
		if err != nil {
			return nil, err
		}
		return h.answer("Stat", r.Filepath, Entries{st}), nil
	}
	return nil, sftp.ErrSSHFxOpUnsupported
}

// Lstat implements sftp.LstatFileLister.
func (h *handler) Lstat(r *sftp.Request) (sftp.ListerAt, error) {
	p, err := h.local(r.Filepath)
	if err != nil {
		return nil, err
	}
	st, err := h.stat(p, os.Lstat)
	if err != nil {
		return nil, err
	}
	return h.answer("Lstat", r.Filepath, Entries{st}), nil
}

// stampedInfo is a file's stat with the modification time the server
// answers (StampMTimes).
type stampedInfo struct {
	os.FileInfo
	mtime time.Time
}

func (s stampedInfo) ModTime() time.Time { return s.mtime }

// Entries answers a listing or stat with the entries it holds (what a
// LieFunc returns to answer with entries of its own, or the truth).
type Entries []os.FileInfo

func (l Entries) ListAt(ls []os.FileInfo, off int64) (int, error) {
	if off >= int64(len(l)) {
		return 0, io.EOF
	}
	n := copy(ls, l[off:])
	if n < len(ls) {
		return n, io.EOF
	}
	return n, nil
}
