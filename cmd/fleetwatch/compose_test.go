package main

import (
	"bytes"
	"context"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
)

// repoRoot is the module root, two levels above this package.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found: %v", err)
	}
	return root
}

// composeFile is the part of docker-compose.yaml the tests read.
type composeFile struct {
	Name     string                    `yaml:"name"`
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       string            `yaml:"build"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	Profiles    []string          `yaml:"profiles"`
	DependsOn   []string          `yaml:"depends_on"`
	Restart     string            `yaml:"restart"`
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "docker-compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("docker-compose.yaml: %v", err)
	}
	return c
}

// mounts maps the container paths of a service's bind mounts to host paths.
func (s composeService) mounts(root string) map[string]string {
	m := map[string]string{}
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || !strings.HasPrefix(parts[0], ".") {
			continue // a named volume
		}
		m[parts[1]] = filepath.Join(root, parts[0])
	}
	return m
}

// hostPath maps a container path to the host through the bind mounts.
func hostPath(mounts map[string]string, p string) (string, bool) {
	for in, host := range mounts {
		if p == in {
			return host, true
		}
		if rest, ok := strings.CutPrefix(p, in+"/"); ok {
			return filepath.Join(host, rest), true
		}
	}
	return "", false
}

func TestComposeFile(t *testing.T) {
	root := repoRoot(t)
	c := loadCompose(t)

	var names []string
	for n := range c.Services {
		names = append(names, n)
	}
	sort.Strings(names)
	want := "fake,fleetwatch,grafana,nats,route,victoriametrics"
	if got := strings.Join(names, ","); got != want {
		t.Errorf("services %s, want %s", got, want)
	}

	for name, s := range c.Services {
		t.Run(name, func(t *testing.T) {
			mounts := s.mounts(root)
			for in, host := range mounts {
				if _, err := os.Stat(host); err != nil {
					t.Errorf("bind mount %s -> %s: %v", host, in, err)
				}
			}
			for _, v := range s.Volumes {
				if src := strings.Split(v, ":")[0]; !strings.HasPrefix(src, ".") {
					if _, ok := c.Volumes[src]; !ok {
						t.Errorf("named volume %s is not declared", src)
					}
				}
			}
			for _, d := range s.DependsOn {
				if _, ok := c.Services[d]; !ok {
					t.Errorf("depends on unknown service %s", d)
				}
			}
			for _, p := range s.Ports {
				if !strings.HasPrefix(p, "127.0.0.1:") {
					t.Errorf("port %s is published beyond the loopback", p)
				}
			}
			// Every file named on the command line is mounted from the repo.
			for _, arg := range s.Command {
				if _, val, ok := strings.Cut(arg, "="); ok {
					arg = val
				}
				if !strings.HasPrefix(arg, "/etc/") {
					continue
				}
				host, ok := hostPath(mounts, arg)
				if !ok {
					t.Errorf("command names %s, which no bind mount provides", arg)
					continue
				}
				if _, err := os.Stat(host); err != nil {
					t.Errorf("command file %s: %v", arg, err)
				}
			}
			if s.Build != "" {
				if _, err := os.Stat(filepath.Join(root, s.Build, "Dockerfile")); err != nil {
					t.Errorf("build context %s: %v", s.Build, err)
				}
			}
			// fleetwatch services run subcommands that exist, with the
			// user of docs/DEPLOY.md.
			if s.Image == "fleetwatch:local" {
				if len(s.Command) == 0 {
					t.Fatal("no command")
				}
				cmd, ok := commands[s.Command[0]]
				if !ok {
					t.Fatalf("fleetwatch has no subcommand %q", s.Command[0])
				}
				// Every flag the service passes is one the subcommand defines.
				var help bytes.Buffer
				_ = cmd.run(context.Background(), []string{"-h"}, &help, &help)
				for _, arg := range s.Command[1:] {
					name, isFlag := strings.CutPrefix(arg, "--")
					if !isFlag {
						continue
					}
					name, _, _ = strings.Cut(name, "=")
					if !strings.Contains(help.String(), "  -"+name+" ") && !strings.Contains(help.String(), "  -"+name+"\n") {
						t.Errorf("fleetwatch %s has no flag --%s:\n%s", s.Command[0], name, help.String())
					}
				}
				wantUser := map[string]string{"fleetwatch": "fleetwatch", "route": "router"}[name]
				if got := s.Environment["NATS_USER"]; got != wantUser {
					t.Errorf("NATS_USER %q, want %q", got, wantUser)
				}
			}
		})
	}

	// The fleetwatch configuration loads with serve's own strict loader.
	cfg, err := config.Load(filepath.Join(root, "deploy", "fleetwatch", "fleetwatch.yaml"))
	if err != nil {
		t.Errorf("deploy/fleetwatch/fleetwatch.yaml: %v", err)
	} else if cfg.HTTP.Listen != "0.0.0.0:8080" {
		t.Errorf("http.listen %q: the container must listen beyond its loopback", cfg.HTTP.Listen)
	}

	// VictoriaMetrics scrapes the fleetwatch service; Grafana reads VictoriaMetrics
	// and loads the dashboards from where compose mounts them.
	var scrape struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, filepath.Join(root, "deploy", "victoriametrics", "scrape.yaml"), &scrape)
	jobs := map[string]string{}
	for _, sc := range scrape.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			jobs[sc.JobName] += strings.Join(st.Targets, ",")
		}
	}
	if diff := cmp.Diff(map[string]string{"fleetwatch": "fleetwatch:8080", "fleetwatch-route": "route:8090"}, jobs); diff != "" {
		t.Errorf("scrape jobs (-want +got):\n%s", diff)
	}
	for job, target := range jobs {
		service, port, _ := strings.Cut(target, ":")
		s, ok := c.Services[service]
		if !ok {
			t.Errorf("job %s scrapes %s, which is no service", job, target)
			continue
		}
		if !strings.Contains(strings.Join(s.Command, " "), ":"+port) && !(service == "fleetwatch" && port == "8080") {
			t.Errorf("job %s scrapes port %s, which %s does not listen on (%v)", job, port, service, s.Command)
		}
	}
	var ds struct {
		Datasources []struct {
			Type, URL string
			IsDefault bool `yaml:"isDefault"`
		} `yaml:"datasources"`
	}
	readYAML(t, filepath.Join(root, "deploy", "grafana", "provisioning", "datasources", "victoriametrics.yaml"), &ds)
	if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" || ds.Datasources[0].URL != "http://victoriametrics:8428" || !ds.Datasources[0].IsDefault {
		t.Errorf("grafana data sources %+v", ds)
	}
	var prov struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, filepath.Join(root, "deploy", "grafana", "provisioning", "dashboards", "fleetwatch.yaml"), &prov)
	if len(prov.Providers) != 1 {
		t.Fatalf("dashboard providers %+v", prov)
	}
	host, ok := hostPath(c.Services["grafana"].mounts(root), prov.Providers[0].Options.Path)
	if !ok {
		t.Fatalf("grafana dashboards path %s is not mounted", prov.Providers[0].Options.Path)
	}
	if matches, _ := filepath.Glob(filepath.Join(host, "*.json")); len(matches) < 2 {
		t.Errorf("grafana dashboards path maps to %s, holding %v", host, matches)
	}
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestDockerfile checks what can be checked without a Docker engine: a
// multi-stage build, a non-root user and a cgo-free build of the command.
// (Building it here would recompile every dependency without cgo, minutes
// on a small machine; `CGO_ENABLED=0 go build ./cmd/fleetwatch` gives a
// statically linked ELF, see docs/DEPLOY.md.)
func TestDockerfile(t *testing.T) {
	root := repoRoot(t)
	data, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var froms, users []string
	var build string
	for _, line := range strings.Split(strings.ReplaceAll(string(data), "\\\n", " "), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		switch strings.ToUpper(fields[0]) {
		case "FROM":
			froms = append(froms, strings.Join(fields[1:], " "))
		case "USER":
			users = append(users, fields[1])
		case "RUN":
			if strings.Contains(line, "go build") {
				build = line
			}
		}
	}
	if len(froms) < 2 {
		t.Errorf("FROM %v: want a build stage and a runtime stage", froms)
	}
	if len(users) == 0 || strings.HasPrefix(users[len(users)-1], "0") || strings.HasPrefix(users[len(users)-1], "root") {
		t.Errorf("USER %v: the runtime stage must not run as root", users)
	}
	if !strings.Contains(build, "CGO_ENABLED=0") || !strings.Contains(build, "./cmd/fleetwatch") {
		t.Fatalf("build command %q: want CGO_ENABLED=0 go build ./cmd/fleetwatch", build)
	}
}
