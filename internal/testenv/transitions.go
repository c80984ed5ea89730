package testenv

import (
	"fmt"
	"strings"

	"github.com/partner-intake/partner-intake/intake/ledger"
)

// transitionGuard is installed in every test database: a trigger that
// refuses any change of a file_intake row's state (and any first state)
// the ledger's transition table (ledger.Transitions) does not list, made
// by intake's own connections (application_name partner-intake/…). A test
// that sets a state by hand on its own connection is not refused. So every
// state-changing statement the suite runs is checked against the table.
func transitionGuard() string {
	var pairs []string
	for _, t := range ledger.Transitions() {
		pairs = append(pairs, fmt.Sprintf("('%s', '%s')", t.From, t.To))
	}
	return fmt.Sprintf(`
CREATE FUNCTION intake_test_transition_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    old_state text := '';
BEGIN
    IF pg_catalog.current_setting('application_name') NOT LIKE 'partner-intake/%%' THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        old_state := OLD.state;
        IF OLD.state = NEW.state THEN
            RETURN NEW;
        END IF;
    END IF;
    IF (old_state, NEW.state) NOT IN (VALUES %s) THEN
        RAISE EXCEPTION 'intake %% goes from state "%%" to "%%", which the ledger''s transition table does not list', NEW.intake_id, old_state, NEW.state
            USING ERRCODE = 'P0001';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER intake_test_transition_guard BEFORE INSERT OR UPDATE OF state ON file_intake
    FOR EACH ROW EXECUTE FUNCTION intake_test_transition_guard();`, strings.Join(pairs, ", "))
}
