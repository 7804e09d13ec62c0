package engine_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/lockd/lockd/engine"
)

// TestProtocolDocStatesTheTombstoneNumbers: docs/protocol.md §6a states
// the tombstone's life and the per-tenant bound that the rule core uses.
func TestProtocolDocStatesTheTombstoneNumbers(t *testing.T) {
	doc, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(doc), "## 6a.")
	end := strings.Index(string(doc), "## 7.")
	if start < 0 || end < start {
		t.Fatal("docs/protocol.md has no §6a before §7")
	}
	section := string(doc[start:end])
	for _, want := range []string{
		fmt.Sprintf("lasts **%g minutes**", engine.TombstoneLife.Minutes()),
		fmt.Sprintf("at most **%d** tombstones", engine.DefaultTombstonesPerTenant),
	} {
		if !strings.Contains(section, want) {
			t.Errorf("docs/protocol.md §6a does not say %q", want)
		}
	}
}
