package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch/dashboards"
)

func TestRunDashboardsExport(t *testing.T) {
	list, err := dashboards.Grafana()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "out")
	run := func(args ...string) error {
		var stdout, stderr bytes.Buffer
		return runDashboards(context.Background(), args, &stdout, &stderr)
	}
	if err := run("export", dir); err != nil {
		t.Fatalf("export: %v", err)
	}
	for _, d := range list {
		got, err := os.ReadFile(filepath.Join(dir, d.File))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(string(d.JSON), string(got)); diff != "" {
			t.Errorf("%s differs from the embedded dashboard (-want +got):\n%s", d.File, diff)
		}
	}

	// An edited dashboard is not overwritten without -force.
	edited := filepath.Join(dir, list[0].File)
	if err := os.WriteFile(edited, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		wantErr error
		want    string // content of the edited file afterwards
	}{
		{"existing file kept", []string{"export", dir}, os.ErrExist, "{}"},
		{"force overwrites", []string{"export", "-force", dir}, nil, string(list[0].JSON)},
		{"no directory", []string{"export"}, errUsage, string(list[0].JSON)},
		{"unknown verb", []string{"import", dir}, errUsage, string(list[0].JSON)},
		{"no verb", nil, errUsage, string(list[0].JSON)},
		{"help", []string{"-h"}, flag.ErrHelp, string(list[0].JSON)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := run(tc.args...)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Errorf("err = %v, want %v", err, tc.wantErr)
			}
			got, rerr := os.ReadFile(edited)
			if rerr != nil {
				t.Fatal(rerr)
			}
			if string(got) != tc.want {
				t.Errorf("%s holds %.60q, want %.60q", edited, got, tc.want)
			}
		})
	}
}

func TestRunDashboardsAlerts(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := runDashboards(context.Background(), []string{"alerts"}, &stdout, &stderr); err != nil {
		t.Fatalf("dashboards alerts: %v", err)
	}
	if diff := cmp.Diff(string(dashboards.AlertRules()), stdout.String()); diff != "" {
		t.Errorf("printed rules differ from the embedded ones (-want +got):\n%s", diff)
	}
}
