package migrations_test

import (
	"testing"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
