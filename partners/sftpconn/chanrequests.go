package sftpconn

import (
	"errors"
	"io"
	"reflect"
	"slices"
	"sync"

	"golang.org/x/crypto/ssh"
)

// A session channel's requests from the site (exit-status, exit-signal,
// a keepalive) must be read, or x/crypto/ssh's connection stops once a
// channel has a few unread: its reader blocks handing the next one over.
// ssh.Client.NewSession reads them on a goroutine for each channel; a
// fleet keeps two or three channels a partner open, and those goroutines
// were a quarter of the daemon's (2,000 of 7,600 at 1,000 partners). The
// connection reads the requests of all its channels on one goroutine
// instead, answering each that wants a reply with a refusal, as
// ssh.Session does; nothing in them is used (an SFTP channel's exit
// status says nothing a failed request does not).
type chanRequests struct {
	add    chan (<-chan *ssh.Request)
	closed <-chan struct{} // the connection's end
}

// newChanRequests starts reading the requests of the channels given to
// add, until the connection closes.
func newChanRequests(closed <-chan struct{}) *chanRequests {
	r := &chanRequests{add: make(chan (<-chan *ssh.Request)), closed: closed}
	go r.run()
	return r
}

func (r *chanRequests) run() {
	cases := []reflect.SelectCase{
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(r.add)},
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(r.closed)},
	}
	for {
		i, v, ok := reflect.Select(cases)
		switch {
		case i == 0:
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: v})
		case i == 1:
			return // every channel's requests end with the connection
		case !ok:
			cases = slices.Delete(cases, i, i+1) // the channel closed
		default:
			if req := v.Interface().(*ssh.Request); req.WantReply {
				req.Reply(false, nil)
			}
		}
	}
}

// serve reads reqs on the connection's goroutine; after the connection's
// end, x/crypto/ssh has closed them and nothing needs reading.
func (r *chanRequests) serve(reqs <-chan *ssh.Request) {
	select {
	case r.add <- reqs:
	case <-r.closed:
	}
}

// openSession opens a session channel on the connection, its requests
// read by the connection's goroutine (chanRequests), for an SFTP
// subsystem (startSubsystem).
func (c *sshConn) openSession() (ssh.Channel, error) {
	ch, reqs, err := c.client.OpenChannel("session", nil)
	if err != nil {
		return nil, err
	}
	c.requests.serve(reqs)
	return ch, nil
}

// startSubsystem asks the site to start the SFTP subsystem on ch, as
// ssh.Session.RequestSubsystem does.
func startSubsystem(ch ssh.Channel) error {
	ok, err := ch.SendRequest("subsystem", true, ssh.Marshal(&struct{ Name string }{"sftp"}))
	if err == nil && !ok {
		err = errSubsystemRefused
	}
	return err
}

// errSubsystemRefused: the site answered the subsystem request with a
// refusal (ssh.Session's words).
var errSubsystemRefused = errors.New("ssh: subsystem request failed")

// packetWriter is a channel's writing side as ssh.Session.StdinPipe gives
// it (Close sends EOF, CloseWrite, not the channel's close), and on a
// server that needs it (sshConn.wholePackets) it sends each SFTP packet
// whole: from the write that starts a packet (its length first) until its
// last byte, no other channel of the connection sends (sends, the
// connection's). pkg/sftp writes a request with data or attributes
// (WRITE, OPEN, SETSTAT) in two writes, each a channel message of its
// own, and another channel's message could come between them. OpenSSH's
// sshd hands each channel's bytes to that channel's own sftp-server;
// ProFTPD's mod_sftp joins a request's parts from whatever channel's
// message comes next (proftpd/proftpd#1897): it applied a SETSTAT with
// garbled times, then waited for a request of 200 MB that never came.
// The cost there: a write the site does not take (its window closed)
// holds the connection's other channels back, other partners' sessions
// on it too, until the site reads it or the connection closes (a
// session's Close closes a connection with a write under way, conns.go).
//
// A channel's writes come one after another (pkg/sftp's and the
// listing channel's own locks), so the framer needs no lock of its own.
type packetWriter struct {
	ch    ssh.Channel
	sends *sync.Mutex // the connection's (sshConn.sends); nil: packets may interleave
	f     framer      // where the bytes sent so far leave the packet under way
}

func (w *packetWriter) Write(p []byte) (int, error) {
	if w.sends == nil {
		return w.ch.Write(p)
	}
	if !w.f.midPacket() {
		w.sends.Lock()
	}
	w.f.packets(p)
	n, err := w.ch.Write(p)
	if err != nil {
		w.f = framer{} // the channel is broken: nothing more of it follows
	}
	if !w.f.midPacket() {
		w.sends.Unlock()
	}
	return n, err
}

func (w *packetWriter) Close() error { return w.ch.CloseWrite() }

var _ io.WriteCloser = (*packetWriter)(nil)
