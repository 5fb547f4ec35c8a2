// Package haproxyctl makes HAProxy follow fleetwatch's decisions through
// its runtime API (the stats socket at level admin): an open backend is
// put in maintenance (or drain), a half-open one gets a small weight, a
// closed one its weight scaled to HAProxy's 0-256.
//
// It reconciles rather than replays: every pass reads the servers' state
// (`show servers state <backend>`) and sends only the commands that make
// it match the latest snapshot, so a restart of either side, a lost
// message or a HAProxy reload is repaired by the next pass, and an
// unchanged fleet costs one read per backend and no write.
package haproxyctl

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
)

// Runtime is a client of HAProxy's runtime API: one connection per
// command, as in HAProxy's non-interactive mode.
type Runtime struct {
	// Network and Addr locate the stats socket: "unix" and a path, or
	// "tcp" and host:port.
	Network, Addr string
	// Timeout bounds one command. If zero, 5s.
	Timeout time.Duration
}

// ErrRuntime wraps a failure to talk to the runtime API or an answer that
// reports an error.
var ErrRuntime = errors.New("haproxyctl: runtime API")

// Command sends one command and returns HAProxy's answer.
func (r *Runtime) Command(ctx context.Context, cmd string) (string, error) {
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	d := net.Dialer{Timeout: timeout}
	conn, err := d.DialContext(ctx, r.Network, r.Addr)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrRuntime, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(conn, cmd+"\n"); err != nil {
		return "", fmt.Errorf("%w: %s: %w", ErrRuntime, cmd, err)
	}
	out, err := io.ReadAll(conn)
	if err != nil {
		return "", fmt.Errorf("%w: %s: %w", ErrRuntime, cmd, err)
	}
	answer := strings.TrimSpace(string(out))
	if lower := strings.ToLower(answer); strings.HasPrefix(lower, "unknown") || strings.Contains(lower, "no such") ||
		strings.Contains(lower, "permission denied") || strings.HasPrefix(lower, "require") || strings.Contains(lower, "invalid") {
		return answer, fmt.Errorf("%w: %s: %s", ErrRuntime, cmd, answer)
	}
	return answer, nil
}

// Admin state bits of `show servers state` (srv_admin_state).
const (
	adminForcedMaint = 0x01
	adminForcedDrain = 0x08
)

// Server is one server as `show servers state` reports it.
type Server struct {
	Backend string
	Name    string
	Admin   int // srv_admin_state bit field
	Weight  int // srv_uweight, 0-256
}

// State is the admin state fleetwatch drives: "ready", "maint" or "drain".
func (s Server) State() string {
	switch {
	case s.Admin&adminForcedMaint != 0:
		return "maint"
	case s.Admin&adminForcedDrain != 0:
		return "drain"
	}
	return "ready"
}

// ParseServersState parses the answer of `show servers state [backend]`
// (format version 1: a version line, a "# be_id be_name srv_id srv_name
// ..." header naming the columns, then one line per server).
func ParseServersState(answer string) ([]Server, error) {
	var cols map[string]int
	var out []Server
	sc := bufio.NewScanner(strings.NewReader(answer))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "":
			continue
		case strings.HasPrefix(line, "#"):
			cols = map[string]int{}
			for i, name := range strings.Fields(strings.TrimPrefix(line, "#")) {
				cols[name] = i
			}
			continue
		case cols == nil:
			continue // the version line
		}
		f := strings.Fields(line)
		get := func(name string) (string, bool) {
			i, ok := cols[name]
			if !ok || i >= len(f) {
				return "", false
			}
			return f[i], true
		}
		be, ok1 := get("be_name")
		name, ok2 := get("srv_name")
		adminS, ok3 := get("srv_admin_state")
		weightS, ok4 := get("srv_uweight")
		if !ok1 || !ok2 || !ok3 || !ok4 {
			return nil, fmt.Errorf("%w: show servers state: short line %q", ErrRuntime, line)
		}
		admin, err1 := strconv.Atoi(adminS)
		weight, err2 := strconv.Atoi(weightS)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%w: show servers state: bad line %q", ErrRuntime, line)
		}
		out = append(out, Server{Backend: be, Name: name, Admin: admin, Weight: weight})
	}
	if cols == nil && strings.TrimSpace(answer) != "" && strings.TrimSpace(answer) != "1" {
		return nil, fmt.Errorf("%w: show servers state: %q", ErrRuntime, answer)
	}
	return out, nil
}

// Settings say how decisions map onto HAProxy. The zero value maps pool p
// to HAProxy backend p and backend id b to server b, and puts open
// backends in maintenance.
type Settings struct {
	// Backends maps a pool to its HAProxy backend; a pool not listed
	// uses its own id.
	Backends map[string]string
	// Servers maps "pool/backend" to a HAProxy server name; a backend not
	// listed uses its own id.
	Servers map[string]string
	// Drain puts open backends in drain (no new connections, existing
	// ones finish) instead of maint.
	Drain bool
}

// Target is the state one server should have.
type Target struct {
	Backend, Server string
	State           string // "ready", "maint" or "drain"
	Weight          int    // 0-256; -1: leave as is (an open server)
}

// Targets computes what every backend of snap should look like in
// HAProxy: open -> maint (or drain), weight untouched; half-open -> ready
// with its small weight (at least 1); closed -> ready with its weight
// scaled to 0-256. A snapshot in shadow mode (docs/PROTOCOL.md "Shadow
// mode (extension)") is applied as p2c.ShadowView rewrites it: HAProxy
// follows the breakers only, or nothing but an operator's overrides.
func Targets(snap *fleetwatch.Snapshot, s Settings) []Target {
	snap = p2c.ShadowView(snap)
	be := snap.Pool
	if v, ok := s.Backends[snap.Pool]; ok {
		be = v
	}
	out := make([]Target, 0, len(snap.Backends))
	for _, b := range snap.Backends {
		srv := b.Backend
		if v, ok := s.Servers[snap.Pool+"/"+b.Backend]; ok {
			srv = v
		}
		t := Target{Backend: be, Server: srv, State: "ready", Weight: scale(b.Weight)}
		switch b.State {
		case fleetwatch.StateOpen:
			t.State, t.Weight = "maint", -1
			if s.Drain {
				t.State = "drain"
			}
		case fleetwatch.StateHalfOpen:
			t.Weight = max(1, t.Weight)
		}
		out = append(out, t)
	}
	return out
}

func scale(w float64) int {
	if !(w > 0) {
		return 0
	}
	return int(math.Min(256, math.Round(w*256)))
}

// Plan returns the commands that move current to targets: only what
// differs. Servers HAProxy does not have are reported in missing. A
// server going out of service changes state first; one coming back gets
// its weight first, so that it never takes traffic at a stale weight.
func Plan(targets []Target, current []Server) (cmds []string, missing []string) {
	have := map[string]Server{}
	for _, s := range current {
		have[s.Backend+"/"+s.Name] = s
	}
	for _, t := range targets {
		key := t.Backend + "/" + t.Server
		cur, ok := have[key]
		if !ok {
			missing = append(missing, key)
			continue
		}
		var weight, state string
		if t.Weight >= 0 && cur.Weight != t.Weight {
			weight = fmt.Sprintf("set server %s weight %d", key, t.Weight)
		}
		if cur.State() != t.State {
			state = fmt.Sprintf("set server %s state %s", key, t.State)
		}
		if t.State == "ready" {
			cmds = appendNonEmpty(cmds, weight, state)
		} else {
			cmds = appendNonEmpty(cmds, state, weight)
		}
	}
	sort.Strings(missing)
	return cmds, missing
}

func appendNonEmpty(dst []string, s ...string) []string {
	for _, v := range s {
		if v != "" {
			dst = append(dst, v)
		}
	}
	return dst
}
