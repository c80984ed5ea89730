package sftpconn

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// HostKeyError is returned when the server's key is not the pinned one.
type HostKeyError struct {
	Partner string
	Address string
	// Got is the SHA256 fingerprint the server presented.
	Got string
	Err error
}

func (e *HostKeyError) Error() string {
	return fmt.Sprintf("partner %s: host key of %s (%s) does not match the pinned known_hosts entry; refusing to connect (possible man-in-the-middle): %v",
		e.Partner, e.Address, e.Got, e.Err)
}

func (e *HostKeyError) Unwrap() error { return e.Err }

// pinnedHostKey loads known_hosts for address and returns a callback that
// accepts only the pinned keys, plus the key algorithms to offer: offering
// only the pinned types stops a server that also holds another key type
// from presenting that one (which knownhosts reports as a mismatch).
// An RSA key is proven by SHA-2 signatures only, unless legacy
// (hostKeyAlgorithmsFor).
func pinnedHostKey(partner, file, address string, legacy bool) (ssh.HostKeyCallback, []string, error) {
	cb, err := knownhosts.New(file)
	if err != nil {
		return nil, nil, fmt.Errorf("known_hosts %s: %w", file, err)
	}
	algos, err := pinnedAlgorithms(file, address, legacy)
	if err != nil {
		return nil, nil, err
	}
	if len(algos) == 0 {
		return nil, nil, fmt.Errorf("known_hosts %s has no entry for %s (add the server's host key, checked out of band)", file, knownhosts.Normalize(address))
	}
	check := func(hostname string, remote net.Addr, key ssh.PublicKey) error {
		if err := cb(hostname, remote, key); err != nil {
			return &HostKeyError{Partner: partner, Address: address, Got: ssh.FingerprintSHA256(key), Err: err}
		}
		return nil
	}
	return check, algos, nil
}

// pinnedAlgorithms lists the host-key algorithms pinned for address.
func pinnedAlgorithms(file, address string, legacy bool) ([]string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("known_hosts: %w", err)
	}
	defer f.Close()
	want := knownhosts.Normalize(address)
	var algos []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20) // grown as a line needs: a 64 KiB start cost every login its garbage
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "@") {
			continue
		}
		_, hosts, key, _, _, err := ssh.ParseKnownHosts([]byte(line))
		if err != nil {
			continue
		}
		for _, h := range hosts {
			if knownhosts.Normalize(h) != want {
				continue
			}
			for _, a := range hostKeyAlgorithmsFor(key.Type(), legacy) {
				if !seen[a] {
					seen[a] = true
					algos = append(algos, a)
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("known_hosts %s: %w", file, err)
	}
	return algos, nil
}

// IsHostKeyMismatch reports whether err is a refused host key.
func IsHostKeyMismatch(err error) bool {
	var he *HostKeyError
	return errors.As(err, &he)
}
