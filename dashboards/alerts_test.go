package dashboards

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestAlertRules checks the embedded rules with Debian's promtool (package
// prometheus): `promtool check rules` and `promtool test rules` with the
// unit tests of testdata/alerts_test.yaml, which feed input series to every
// rule and say when it fires, with which labels and annotations.
func TestAlertRules(t *testing.T) {
	promtool := testkit.RequireTool(t, "/usr/bin/promtool", "prometheus")
	dir := t.TempDir()
	unit, err := os.ReadFile(filepath.Join("testdata", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"alerts.yaml": AlertRules(), "alerts_test.yaml": unit} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{{"check", "rules", "alerts.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}

var metricName = regexp.MustCompile(`\bfleetwatch_[a-z0-9_]+`)

// TestAlertRulesUseRealMetrics: every metric the rules and their unit tests
// name is listed in docs/METRICS.md (whose own test checks it against a
// real /metrics), and every rule has a unit test.
func TestAlertRulesUseRealMetrics(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "METRICS.md"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(fleetwatch_[a-z0-9_]+)` \\|").FindAllStringSubmatch(string(doc), -1) {
		listed[m[1]] = true
	}
	unit, err := os.ReadFile(filepath.Join("testdata", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	used := metricName.FindAllString(string(AlertRules()), -1)
	used = append(used, metricName.FindAllString(string(unit), -1)...)
	if len(used) < 6 {
		t.Fatalf("only %d metric names found", len(used))
	}
	for _, name := range used {
		if !listed[name] {
			t.Errorf("%s is not a metric of docs/METRICS.md", name)
		}
	}
	alertName := regexp.MustCompile(`(?m)^\s*-?\s*alert(?:name)?: (\w+)`)
	var rules, tested []string
	for _, m := range alertName.FindAllStringSubmatch(string(AlertRules()), -1) {
		rules = append(rules, m[1])
	}
	for _, m := range alertName.FindAllStringSubmatch(string(unit), -1) {
		tested = append(tested, m[1])
	}
	if len(rules) < 6 {
		t.Fatalf("rules %v", rules)
	}
	for _, r := range rules {
		if !slices.Contains(tested, r) {
			t.Errorf("rule %s has no unit test in testdata/alerts_test.yaml", r)
		}
	}
}
