// Package sftpconn is the SFTP transport to a partner's site: the SSH
// connection with the partner's pinned host key and intake's algorithms
// (hostkey.go, algorithms.go), connections shared by partners on one
// account with one keepalive each (conns.go), the Session over pkg/sftp
// with a deadline on every request (session.go), the listing channel
// (listdir.go), the `intake check` probes (probe.go, access.go,
// measure.go) and the site's directories (dirs.go). What a partner is
// (its config, layout, ready rules, manifest format and measured
// Profile) is package partners, which this package reads and which never
// imports it.
//
// pkg/sftp carries transfers. Each piece of SFTP written by hand beside
// it, and why (docs/performance.md, "SFTP requests written by hand",
// unless said otherwise):
//
//   - listdir.go: listings streamed and multiplexed on a channel of their
//     own, the directories' MKDIRs and STATs sent at once; pkg/sftp
//     returns whole listings, one at a time (a poll's listings 4 → 2
//     round trips).
//   - wholefile.go: a small file's WRITEs and CLOSE sent together;
//     pkg/sftp's Close waits behind the Write's reply (3 → 2 round trips).
//   - readwhole.go: a manifest's FSTAT, READs and CLOSE sent together once
//     the OPEN is answered (4 → 2 round trips).
//   - renameopen.go: a claim's OPEN and LSTAT sent behind its RENAME on
//     OpenSSH (the far file's first byte 964 → 822 ms).
//   - chanreader.go: channel reads the session can break; x/crypto/ssh's
//     read ends only when the server confirms the close, which OpenSSH
//     withholds while its sftp-server is stuck (needed for shared
//     connections; its copy costs within the noise).
//   - watchdog.go: a deadline on requests pkg/sftp's calls take no context
//     for; it is for hung sites, not speed, so no figure: the section
//     says so and points to docs/failure-matrix.md.
//   - quickack.go: TCP_QUICKACK until the session is up, so sshd's
//     channel confirmation does not wait for a delayed ACK (the channel
//     open 46.9 → 5.8 ms, a dial 122.8 → 80.7 ms).
package sftpconn
