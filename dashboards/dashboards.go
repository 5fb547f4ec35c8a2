// Package dashboards holds what people look at, embedded in the binary with
// go:embed so that a deployment needs no other files: the live status page
// (plain HTML, CSS and JavaScript, no external assets) that `fleetwatch serve`
// serves at "/", and the Grafana dashboards (JSON, current schema) for a
// Prometheus-compatible data source such as VictoriaMetrics, which
// `fleetwatch dashboards export DIR` writes out and docker-compose provisions.
//
// The package imports nothing from the project: the page reads the JSON of
// /api/status, and the dashboards query the metric names listed in
// docs/METRICS.md.
package dashboards

import (
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
)

// ErrInvalidDashboard is returned when an embedded dashboard is not a valid
// Grafana dashboard (a defect of the build, caught by the tests).
var ErrInvalidDashboard = errors.New("dashboards: invalid dashboard")

//go:embed status
var statusFiles embed.FS

//go:embed grafana/*.json
var grafanaFiles embed.FS

// Status returns the status page assets: index.html, app.js and style.css at
// the root of the file system.
func Status() fs.FS {
	sub, err := fs.Sub(statusFiles, "status")
	if err != nil { // the directory is embedded at build time
		panic(err)
	}
	return sub
}

// Dashboard is one Grafana dashboard.
type Dashboard struct {
	// File is the file name, for example "fleetwatch-overview.json".
	File string
	// UID and Title are read from the JSON.
	UID, Title string
	// JSON is the dashboard model as Grafana imports it.
	JSON []byte
}

// Grafana returns every embedded Grafana dashboard, sorted by file name.
func Grafana() ([]Dashboard, error) {
	entries, err := fs.ReadDir(grafanaFiles, "grafana")
	if err != nil {
		return nil, err
	}
	var out []Dashboard
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		data, err := grafanaFiles.ReadFile(path.Join("grafana", e.Name()))
		if err != nil {
			return nil, err
		}
		var head struct {
			UID   string `json:"uid"`
			Title string `json:"title"`
		}
		if err := json.Unmarshal(data, &head); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrInvalidDashboard, e.Name(), err)
		}
		if head.UID == "" || head.Title == "" {
			return nil, fmt.Errorf("%w: %s: uid and title are required", ErrInvalidDashboard, e.Name())
		}
		out = append(out, Dashboard{File: e.Name(), UID: head.UID, Title: head.Title, JSON: data})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].File < out[j].File })
	return out, nil
}

// Query is one PromQL/MetricsQL expression of a dashboard: a panel target, a
// template variable or an annotation.
type Query struct {
	Kind       string // "panel", "variable" or "annotation"
	Title      string // the panel, variable or annotation name
	RefID      string // the target's refId, for panels
	Datasource string // the data source uid, "${datasource}" for every query here
	Expr       string // with Grafana variables ($pool, $__rate_interval) unexpanded
}

// grafanaModel is the part of a dashboard model that Queries reads.
type grafanaModel struct {
	Panels      []grafanaPanel `json:"panels"`
	Annotations struct {
		List []struct {
			Name       string       `json:"name"`
			Datasource grafanaDSRef `json:"datasource"`
			Expr       string       `json:"expr"`
			BuiltIn    int          `json:"builtIn"`
		} `json:"list"`
	} `json:"annotations"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Datasource grafanaDSRef    `json:"datasource"`
			Query      json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type grafanaDSRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type grafanaPanel struct {
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource *grafanaDSRef  `json:"datasource"`
	Panels     []grafanaPanel `json:"panels"` // a collapsed row's panels
	Targets    []struct {
		RefID      string        `json:"refId"`
		Expr       string        `json:"expr"`
		Datasource *grafanaDSRef `json:"datasource"`
	} `json:"targets"`
}

// Queries returns every query of the dashboard, in panel order, then the
// query variables, then the annotations. Rows contribute their collapsed
// panels' queries.
func (d Dashboard) Queries() ([]Query, error) {
	var m grafanaModel
	if err := json.Unmarshal(d.JSON, &m); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalidDashboard, d.File, err)
	}
	var out []Query
	var walk func(ps []grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, t := range p.Targets {
				ds := ""
				switch {
				case t.Datasource != nil:
					ds = t.Datasource.UID
				case p.Datasource != nil:
					ds = p.Datasource.UID
				}
				out = append(out, Query{Kind: "panel", Title: p.Title, RefID: t.RefID, Datasource: ds, Expr: t.Expr})
			}
		}
	}
	walk(m.Panels)
	for _, v := range m.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			// Older models store the query as a plain string.
			if err := json.Unmarshal(v.Query, &q.Query); err != nil {
				return nil, fmt.Errorf("%w: %s: variable %s: %v", ErrInvalidDashboard, d.File, v.Name, err)
			}
		}
		out = append(out, Query{Kind: "variable", Title: v.Name, Datasource: v.Datasource.UID, Expr: q.Query})
	}
	for _, a := range m.Annotations.List {
		if a.BuiltIn == 0 && a.Expr != "" {
			out = append(out, Query{Kind: "annotation", Title: a.Name, Datasource: a.Datasource.UID, Expr: a.Expr})
		}
	}
	return out, nil
}
