package sitefile

import (
	"fmt"
	"path"
	"time"

	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// PutBack renames a claimed file back into ready/ under its name
// (RENAME never overwrites). If ready/ holds that name again, the claimed
// copy goes to quarantine/ under a generated name and the reconciler
// raises quarantine_no_record for a human. A rename that fails leaves the
// put back undone unless the file is gone from its claimed path: a
// "no such file" may mean ready/ itself is missing, not the file. size is
// the file's, for a server whose RENAME copies (Session.AllowCopy).
func PutBack(sess *sftpconn.Session, claimedPath, name string, size int64) error {
	err := sess.RenameSized(claimedPath, sess.Layout.Ready(name), size)
	if err == nil {
		return nil
	}
	if _, serr := sess.Lstat(sess.Layout.Ready(name)); serr != nil {
		if _, cerr := sess.Lstat(claimedPath); sftpconn.IsNotExist(cerr) {
			return nil // moved meanwhile, or the rename's reply was lost
		}
		return fmt.Errorf("put back %s: %w", path.Base(claimedPath), err)
	}
	dst := path.Join(sess.Layout.QuarantineDir(), FitStem(fmt.Sprintf("put-back.%d.", time.Now().UnixNano()), name, "", HeldReserve))
	if err := sess.RenameSized(claimedPath, dst, size); err != nil && !sftpconn.IsNotExist(err) {
		return fmt.Errorf("put back %s: %w", path.Base(claimedPath), err)
	}
	return nil
}
