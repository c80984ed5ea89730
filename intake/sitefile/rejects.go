package sitefile

import (
	"bufio"
	"encoding/csv"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/partner-intake/partner-intake/intake/ledger"
)

// Issues gives each row issue of a rejects report to row, in line order.
type Issues func(row func(ledger.IssueRow) error) error

// RejectsCSV renders the rejects report's lines: line, column, reason,
// outcome and detail (codes: the SQLSTATE of a row the target refused)
// of every row issue each gives. It echoes no cell value; every cell is
// still neutralised against spreadsheet formula injection.
func RejectsCSV(out io.Writer, each Issues) error {
	w := csv.NewWriter(out)
	_ = w.Write([]string{"line", "column", "reason", "outcome", "detail"})
	err := each(func(is ledger.IssueRow) error {
		return w.Write([]string{strconv.FormatInt(is.Line, 10), Neutralize(is.Column), Neutralize(string(is.Reason)), Neutralize(is.Outcome), Neutralize(is.Detail)})
	})
	if err != nil {
		return err
	}
	w.Flush()
	return w.Error()
}

// Neutralize makes a cell safe to open in a spreadsheet: a cell starting
// with =, +, -, @, tab or CR is prefixed with a single quote (OWASP CSV
// injection).
func Neutralize(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return "'" + s
	}
	return s
}

// PlannedRejects is a rejects report's lines rendered from a plan's
// rejected rows right after the plan committed, beside the apply, into a
// temporary file that is unlinked as soon as it is made: nothing of it
// outlives the run, and no sweep of stale temporary files meets it
// however long the apply takes. They are the report's lines while the
// file's only row issues are those the plan recorded: the ledger counts
// every issue recorded for a file, the plan's and those the apply adds
// (a row the target refused, a key repeated, one held back in
// conflict), in its rows_rejected or rows_conflict, in the transaction
// that records it (ledger.IssueCounts).
type PlannedRejects struct {
	rows int64 // the rejected rows the plan recorded
	done chan struct{}
	f    *os.File
	err  error
}

// RenderPlanned starts rendering the lines of a plan that recorded rows
// rejected rows, each given by each, into the file create makes.
func RenderPlanned(create func() (*os.File, error), rows int64, each Issues) *PlannedRejects {
	p := &PlannedRejects{rows: rows, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.f, p.err = renderUnlinked(create, each)
	}()
	return p
}

func renderUnlinked(create func() (*os.File, error), each Issues) (*os.File, error) {
	f, err := create()
	if err != nil {
		return nil, err
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, err
	}
	bw := bufio.NewWriterSize(f, 64<<10)
	err = RejectsCSV(bw, each)
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Take waits for the lines and hands them over when counts, the file's
// rows_rejected and rows_conflict as the ledger holds them now, say they
// are still its every row issue; the caller closes the file. nil, with
// why, otherwise (the report's lines are then read from the ledger). A
// nil PlannedRejects has none.
func (p *PlannedRejects) Take(counts func() (rejected, conflict int64, err error)) (f *os.File, why error) {
	if p == nil {
		return nil, nil
	}
	<-p.done
	if p.err != nil {
		return nil, p.err
	}
	rejected, conflict, err := counts()
	if err != nil || rejected != p.rows || conflict != 0 {
		p.f.Close()
		return nil, err
	}
	return p.f, nil
}

// Drop waits for the lines and closes them (not used: the run ended
// before its report, or the file is planned again).
func (p *PlannedRejects) Drop() {
	if p == nil {
		return
	}
	<-p.done
	if p.f != nil {
		p.f.Close()
	}
}
