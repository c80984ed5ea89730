package names

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// checks pairs each check with its rule.
var checks = []struct {
	name  string
	check func(string) bool
	rule  string
}{
	{"PartnerID", PartnerID, PartnerIDRule},
	{"WorkerID", WorkerID, WorkerIDRule},
	{"Ident", Ident, IdentRule},
	{"Target", Target, TargetRule},
	{"EnvName", EnvName, EnvNameRule},
	{"SHA256Hex", SHA256Hex, SHA256HexRule},
}

// edges are strings at each rule's borders: lengths 0, 1, the maximum and
// one past it, every character class in first and later places, dots,
// a trailing newline ($ must not allow it), multi-byte characters.
func edges() []string {
	s := []string{"", "a", "A", "0", "_", "-", ".", "a.", ".a", "a.b", "a..b", "a.b.c", "a\n", "\na", "a b", "é", "aé",
		"A_1", "x-y", "x.y-z", "_x", "-x", "9x", "orders", "public.orders", "Public.orders", "public._t", "a.9",
		"\x00", "a\x00", "ab\u212a", "K", "ſ"}
	for _, n := range []int{62, 63, 64, 65, 127, 128, 129} {
		for _, c := range []string{"a", "A", "0", "f", "g", "_", "-", "."} {
			s = append(s, strings.Repeat(c, n), "a"+strings.Repeat(c, n-1), strings.Repeat(c, n-1)+"a")
		}
		s = append(s, "a."+strings.Repeat("b", n), strings.Repeat("b", n)+".a")
	}
	return s
}

func TestEveryCheckKeepsToItsRule(t *testing.T) {
	alphabet := []byte("abcfgzAFZ0919_-.\n é\x00")
	r := rand.New(rand.NewPCG(1, 2))
	corpus := edges()
	for range 20000 {
		n := r.IntN(140)
		if r.IntN(2) == 0 {
			n = r.IntN(8)
		}
		b := make([]byte, n)
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		corpus = append(corpus, string(b))
	}
	for _, c := range checks {
		re := regexp.MustCompile(c.rule)
		accepted := 0
		for _, s := range corpus {
			if got, want := c.check(s), re.MatchString(s); got != want {
				t.Errorf("%s(%q) = %v, its rule %s says %v", c.name, s, got, c.rule, want)
			} else if got {
				accepted++
			}
		}
		if accepted == 0 {
			t.Errorf("%s accepted nothing of the corpus: the comparison proves nothing", c.name)
		}
	}
}

func FuzzEveryCheckKeepsToItsRule(f *testing.F) {
	for _, s := range edges() {
		f.Add(s)
	}
	res := make([]*regexp.Regexp, len(checks))
	for i, c := range checks {
		res[i] = regexp.MustCompile(c.rule)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for i, c := range checks {
			if got, want := c.check(s), res[i].MatchString(s); got != want {
				t.Errorf("%s(%q) = %v, its rule %s says %v", c.name, s, got, c.rule, want)
			}
		}
	})
}
