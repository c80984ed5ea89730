package bench

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// dialRuns is how many dials dialMs times.
const dialRuns = 15

// dialMs is the median time of sftpconn.Dial to sshd (through the latency
// proxy while it is set), session closed after each: TCP, key exchange,
// login, both channels and their SFTP start, every dial costs a partner
// this before its first request (docs/performance.md).
func (e *env) dialMs(ctx context.Context) (float64, error) {
	root, err := e.partnerSite("dial")
	if err != nil {
		return 0, err
	}
	p := &partners.Config{ID: "dial", SFTP: partners.SFTP{Address: e.sshAddr(), User: e.sshd.User,
		PrivateKeyFile: e.sshd.ClientKeyFile, KnownHostsFile: e.knownHosts(), Root: root},
		Feeds: []partners.Feed{{Name: "f", Pattern: `.*\.csv`, Target: "t", Key: []string{"id"},
			Columns: []partners.Column{{Name: "id", Type: "text", Required: true}}}}}
	p.SetDefaults()
	if err := p.Validate("dial"); err != nil {
		return 0, err
	}
	var ms []float64
	for range dialRuns {
		start := time.Now()
		s, err := sftpconn.Dial(ctx, p)
		if err != nil {
			return 0, fmt.Errorf("dial: %w", err)
		}
		ms = append(ms, float64(time.Since(start))/1e6)
		s.Close()
	}
	sort.Float64s(ms)
	return ms[len(ms)/2], nil
}
