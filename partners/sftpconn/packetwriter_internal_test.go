package sftpconn

import "testing"

// Each SFTP packet goes out whole to every server but OpenSSH's sshd,
// which hands each channel's bytes to that channel's own sftp-server: its
// sessions sharing a connection never wait on each other's writes.
func TestEveryServerButOpenSSHIsSentWholePackets(t *testing.T) {
	for version, want := range map[string]bool{
		"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3": false,
		"SSH-2.0-OpenSSH_for_Windows_8.1":        false,
		"SSH-2.0-mod_sftp":                       true,
		"SSH-2.0-Go":                             true, // rclone, pkg/sftp's servers
		"SSH-2.0-AWS_SFTP_1.1":                   true,
	} {
		if got := (&sshConn{version: version}).wholePackets(); got != want {
			t.Errorf("%q: whole packets %v, want %v", version, got, want)
		}
	}
}
