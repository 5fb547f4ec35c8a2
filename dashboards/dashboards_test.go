package dashboards

import (
	"encoding/json"
	"io/fs"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestStatusAssets(t *testing.T) {
	got, err := fs.Glob(Status(), "*")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"app.js", "index.html", "style.css"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("status assets (-want +got):\n%s", diff)
	}
}

// TestStatusPageLoadsNothingExternal keeps the page self-contained (no CDN)
// and its script free of the HTML-parsing sinks that would let a backend id
// inject markup.
func TestStatusPageLoadsNothingExternal(t *testing.T) {
	external := regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?\s*(https?:)?//`)
	for _, name := range []string{"index.html", "app.js", "style.css"} {
		data, err := fs.ReadFile(Status(), name)
		if err != nil {
			t.Fatal(err)
		}
		if m := external.Find(data); m != nil {
			t.Errorf("%s loads an external asset: %s", name, m)
		}
		if strings.Contains(string(data), "@import") {
			t.Errorf("%s imports a style sheet", name)
		}
	}
	js, err := fs.ReadFile(Status(), "app.js")
	if err != nil {
		t.Fatal(err)
	}
	for _, sink := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"} {
		if strings.Contains(string(js), sink) {
			t.Errorf("app.js uses %s; build DOM nodes and set textContent instead", sink)
		}
	}
}

type panelJSON struct {
	ID         int                      `json:"id"`
	Type       string                   `json:"type"`
	Title      string                   `json:"title"`
	Datasource *grafanaDSRef            `json:"datasource"`
	GridPos    struct{ X, Y, W, H int } `json:"gridPos"`
	Panels     []panelJSON              `json:"panels"`
	Targets    []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

type dashboardJSON struct {
	UID           string      `json:"uid"`
	Title         string      `json:"title"`
	SchemaVersion int         `json:"schemaVersion"`
	Panels        []panelJSON `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource grafanaDSRef    `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

func TestGrafanaDashboards(t *testing.T) {
	list, err := Grafana()
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	uids := map[string]bool{}
	for _, d := range list {
		files = append(files, d.File)
		if uids[d.UID] {
			t.Errorf("%s: uid %s used twice", d.File, d.UID)
		}
		uids[d.UID] = true
		var m dashboardJSON
		if err := json.Unmarshal(d.JSON, &m); err != nil {
			t.Fatalf("%s: %v", d.File, err)
		}
		if m.SchemaVersion < 39 {
			t.Errorf("%s: schemaVersion %d, want >= 39", d.File, m.SchemaVersion)
		}
		vars := map[string]string{}
		for _, v := range m.Templating.List {
			vars[v.Name] = v.Type
		}
		if vars["datasource"] != "datasource" {
			t.Errorf("%s: no template variable datasource of type datasource (variables %v)", d.File, vars)
		}
		ids := map[int]bool{}
		var check func(ps []panelJSON)
		check = func(ps []panelJSON) {
			for _, p := range ps {
				check(p.Panels)
				if ids[p.ID] {
					t.Errorf("%s: panel id %d used twice", d.File, p.ID)
				}
				ids[p.ID] = true
				if p.Title == "" {
					t.Errorf("%s: panel %d has no title", d.File, p.ID)
				}
				if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
					t.Errorf("%s: panel %q: gridPos %+v outside the 24-column grid", d.File, p.Title, p.GridPos)
				}
				if p.Type == "row" {
					continue
				}
				if p.Datasource == nil || p.Datasource.UID != "${datasource}" || p.Datasource.Type != "prometheus" {
					t.Errorf("%s: panel %q: datasource %+v, want the ${datasource} variable", d.File, p.Title, p.Datasource)
				}
				if len(p.Targets) == 0 {
					t.Errorf("%s: panel %q has no query", d.File, p.Title)
				}
				for _, tg := range p.Targets {
					if strings.TrimSpace(tg.Expr) == "" || tg.RefID == "" {
						t.Errorf("%s: panel %q: target %+v lacks expr or refId", d.File, p.Title, tg)
					}
				}
			}
		}
		check(m.Panels)
	}
	if diff := cmp.Diff([]string{"fleetwatch-overview.json", "fleetwatch-pool.json"}, files); diff != "" {
		t.Errorf("dashboards (-want +got):\n%s", diff)
	}
}

func TestPoolDashboardVariables(t *testing.T) {
	list, err := Grafana()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range list {
		if d.UID != "fleetwatch-pool" {
			continue
		}
		qs, err := d.Queries()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		annotations := 0
		for _, q := range qs {
			switch q.Kind {
			case "variable":
				got[q.Title] = q.Expr
			case "annotation":
				annotations++
				if !strings.Contains(q.Expr, "fleetwatch_breaker_transitions_total") {
					t.Errorf("annotation %q does not show breaker transitions: %s", q.Title, q.Expr)
				}
			case "panel":
				if !strings.Contains(q.Expr, `pool="$pool"`) {
					t.Errorf("panel %q does not select the pool: %s", q.Title, q.Expr)
				}
			}
			if q.Datasource != "${datasource}" {
				t.Errorf("%s %q: datasource %q", q.Kind, q.Title, q.Datasource)
			}
		}
		want := map[string]string{
			"pool":    "label_values(fleetwatch_backend_state, pool)",
			"backend": `label_values(fleetwatch_backend_state{pool="$pool"}, backend)`,
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("variables (-want +got):\n%s", diff)
		}
		if annotations == 0 {
			t.Error("no breaker-transition annotation")
		}
		return
	}
	t.Fatal("no fleetwatch-pool dashboard")
}
