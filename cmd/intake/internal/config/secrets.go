package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"github.com/partner-intake/partner-intake/partners"
)

// checkSecretFiles refuses a partner's SSH private key or password file,
// or a feed's PGP secret key file, that users other than intake's may read
// or write, naming the setting and the file's mode (secretModeOK says
// which modes pass). A file that does not exist is told where it is used
// (the dial, the first encrypted file), as before.
func checkSecretFiles(ps []partners.Config) error {
	uid, gid := os.Getuid(), os.Getgid()
	for i := range ps {
		s := ps[i].SFTP
		files := []struct{ key, path string }{{"sftp.private_key_file", s.PrivateKeyFile}, {"sftp.password_file", s.PasswordFile}}
		for j, f := range ps[i].Feeds {
			if f.PGP != nil {
				files = append(files, struct{ key, path string }{fmt.Sprintf("feeds[%d] (name %s).pgp.private_key_file", j, f.Name), f.PGP.PrivateKeyFile})
			}
		}
		for _, f := range files {
			if f.path == "" {
				continue
			}
			fi, err := os.Stat(f.path) // a Kubernetes secret's file is a link to its data
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return fmt.Errorf("partners[%d] (id %s).%s: %w", i, ps[i].ID, f.key, err)
			}
			owner, group := -1, -1
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				owner, group = int(st.Uid), int(st.Gid)
			}
			if !secretModeOK(fi.Mode().Perm(), owner, group, uid, gid) {
				return fmt.Errorf("partners[%d] (id %s).%s: %s is mode %04o (owner %d, group %d): others than intake's user may read it; make it 0600 owned by intake's user, or 0640 owned by root with intake's group",
					i, ps[i].ID, f.key, f.path, fi.Mode().Perm(), owner, group)
			}
		}
	}
	return nil
}

// secretModeOK reports whether a secret file of mode perm, owned by owner
// and group, is readable and writable by intake's user (uid, gid) and
// root alone: no bit for others, and group bits only where the group is
// how intake reads a file someone else owns (root:intake 0640 as the
// Debian package makes it, a Kubernetes secret mounted 0440 root:fsGroup).
// A file intake's own user owns has no use for group bits (OpenSSH refuses
// a key of its user's with mode & 077 likewise).
func secretModeOK(perm fs.FileMode, owner, group, uid, gid int) bool {
	switch {
	case perm&0o007 != 0:
		return false
	case perm&0o070 == 0:
		return true
	default:
		return owner != uid && group == gid && owner >= 0
	}
}
