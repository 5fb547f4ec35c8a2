package fleetwatch_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// sharedProtocol is the shared contract, beside the project's checkout.
const sharedProtocol = "../shared/PROTOCOL.md"

// TestProtocolDocIsSuperset keeps docs/PROTOCOL.md a superset of the shared
// contract: every heading, table row, code span (subjects, field names,
// values, bucket and stream names) and JSON field name of the shared page
// appears in it. Prose may be reworded or reflowed; the contract's items
// may not be lost. Outside CI the test is skipped when the shared page is
// not there; in CI (CI set) that is a failure.
func TestProtocolDocIsSuperset(t *testing.T) {
	shared, err := os.ReadFile(sharedProtocol)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s: %v: CI must check docs/PROTOCOL.md against the shared contract", sharedProtocol, err)
		}
		t.Skipf("the shared contract is not beside the project (required when CI is set): %v", err)
	}
	ours, err := os.ReadFile("docs/PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	items := contractItems(string(shared))
	// The shared page has headings, three tables, JSON examples and many
	// code spans: finding none of one kind means the extraction is broken.
	for kind, n := range items.counts() {
		if n == 0 {
			t.Errorf("found no %s in %s: the checker no longer reads the page", kind, sharedProtocol)
		}
	}
	checkSuperset(t, items, string(ours))
}

// TestProtocolSupersetChecker checks the checker: it accepts a document
// that rewords prose around the contract and adds to it, and reports each
// kind of loss.
func TestProtocolSupersetChecker(t *testing.T) {
	const contract = "# wire\n\n## Decision\n\nPublished on `fw.decisions.<pool>` and kept in\n" +
		"the bucket `fw_decisions`.\n\n```json\n{\n  \"v\": 1,\n  \"open_until\": null\n}\n```\n\n" +
		"| field | meaning |\n|---|---|\n| `v` | schema version; `1` |\n| `open_until` | when an `open` breaker becomes `half_open`; `null` otherwise |\n\n" +
		"The digest is `{\"v\":1,\"since\":…}`.\n"
	items := contractItems(contract)
	for kind, n := range items.counts() {
		if n == 0 {
			t.Fatalf("found no %s in the test contract", kind)
		}
	}
	tests := []struct {
		name   string
		ours   string
		wantOK bool
	}{
		{"verbatim", contract, true},
		{"prose reflowed, reworded and added to, a column added", strings.NewReplacer(
			"Published on `fw.decisions.<pool>` and kept in\nthe bucket", "Each snapshot is published on `fw.decisions.<pool>`, and the last one is kept\nin the KV bucket",
			"| field | meaning |\n|---|---|", "| field | meaning | since |\n|:--|---|---|",
			"| `v` | schema version; `1` |", "|  `v`  | schema version;   `1` | 1.0 |",
		).Replace(contract) + "\n# additions\n\n| `since` | extension |\n", true},
		{"heading lost", strings.Replace(contract, "## Decision\n", "", 1), false},
		{"subject renamed", strings.Replace(contract, "`fw.decisions.<pool>`", "`fw.decision.<pool>`", 1), false},
		{"bucket lost", strings.Replace(contract, "the bucket `fw_decisions`", "a bucket", 1), false},
		{"table row changed", strings.Replace(contract, "`null` otherwise", "absent otherwise", 1), false},
		{"table row lost", strings.Replace(contract, "| `v` | schema version; `1` |\n", "", 1), false},
		{"field of the inline digest lost", strings.Replace(contract, `"since":…`, `"from":…`, 1), false},
		{"field of the JSON example lost", strings.NewReplacer(`"open_until": null`, `"open": null`, "`open_until`", "`open`").Replace(contract), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var f fakeT
			checkSuperset(&f, items, tt.ours)
			if f.failed == tt.wantOK {
				t.Errorf("checkSuperset reported a loss: %v, want %v", f.failed, !tt.wantOK)
			}
		})
	}
}

// contract is what docs/PROTOCOL.md must keep of the shared page.
type contract struct {
	headings []string   // "## Decision snapshot"
	rows     [][]string // table rows, as trimmed cells with spaces collapsed
	spans    []string   // code spans: subjects, field names, values, names
	fields   []string   // JSON field names, from the examples
}

func (c contract) counts() map[string]int {
	return map[string]int{"headings": len(c.headings), "table rows": len(c.rows), "code spans": len(c.spans), "JSON fields": len(c.fields)}
}

var (
	codeSpan  = regexp.MustCompile("`([^`\n]+)`")
	jsonField = regexp.MustCompile(`"([A-Za-z0-9_]+)"\s*:`)
	tableRule = regexp.MustCompile(`^\|[\s:|-]+\|$`)
)

func contractItems(doc string) contract {
	var c contract
	inFence := false
	seen := map[string]bool{}
	add := func(list *[]string, kind, s string) {
		if !seen[kind+s] {
			seen[kind+s] = true
			*list = append(*list, s)
		}
	}
	for _, line := range strings.Split(doc, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") {
			inFence = !inFence
			continue
		}
		for _, m := range jsonField.FindAllStringSubmatch(line, -1) {
			add(&c.fields, "field", m[1])
		}
		if inFence {
			continue
		}
		switch {
		case strings.HasPrefix(trimmed, "#"):
			add(&c.headings, "heading", trimmed)
		case strings.HasPrefix(trimmed, "|") && !tableRule.MatchString(trimmed):
			c.rows = append(c.rows, tableCells(trimmed))
		}
		for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
			add(&c.spans, "span", m[1])
		}
	}
	return c
}

// tableCells splits a Markdown table row into its cells, each trimmed and
// with runs of white space collapsed.
func tableCells(row string) []string {
	parts := strings.Split(strings.Trim(row, "|"), "|")
	for i, p := range parts {
		parts[i] = strings.Join(strings.Fields(p), " ")
	}
	return parts
}

// checkSuperset reports every item of c that ours lacks. A table row is
// kept when a row of ours has the same first cell and contains each other
// cell (in any column: ours may add columns or text to a cell).
func checkSuperset(t reporter, c contract, ours string) {
	t.Helper()
	var ourRows [][]string
	headings := map[string]bool{}
	for _, line := range strings.Split(ours, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "#"):
			headings[trimmed] = true
		case strings.HasPrefix(trimmed, "|") && !tableRule.MatchString(trimmed):
			ourRows = append(ourRows, tableCells(trimmed))
		}
	}
	for _, h := range c.headings {
		if !headings[h] {
			t.Errorf("docs/PROTOCOL.md lacks the heading %q of the shared contract", h)
		}
	}
	for _, row := range c.rows {
		if !hasRow(ourRows, row) {
			t.Errorf("docs/PROTOCOL.md lacks the table row | %s | of the shared contract", strings.Join(row, " | "))
		}
	}
	for _, s := range c.spans {
		if !strings.Contains(ours, "`"+s+"`") {
			t.Errorf("docs/PROTOCOL.md lacks `%s` of the shared contract", s)
		}
	}
	for _, f := range c.fields {
		if !strings.Contains(ours, `"`+f+`"`) && !strings.Contains(ours, "`"+f+"`") {
			t.Errorf("docs/PROTOCOL.md lacks the JSON field %q of the shared contract", f)
		}
	}
}

func hasRow(rows [][]string, want []string) bool {
	for _, row := range rows {
		if len(row) == 0 || row[0] != want[0] {
			continue
		}
		all := true
		for _, cell := range want[1:] {
			found := false
			for _, ourCell := range row[1:] {
				if strings.Contains(ourCell, cell) {
					found = true
					break
				}
			}
			if !found {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}
