package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Portkey's open-source AI gateway (npm @portkey-ai/gateway) as a peer. It
// has no health tracking of its own (the circuit breaker of Portkey's
// documentation belongs to its hosted product; the open-source gateway
// passes cb_config through unread), so its documented way to survive a
// bad backend is a config of load balancing over fallback chains: each
// request draws one of four targets by weight, and each target is a
// fallback chain of three backends (b_i, b_i+1, b_i+2) that moves on at
// a 408, 429 or 5xx. The config rides on every request in the
// x-portkey-config header, as Portkey's docs show; request_timeout is the
// benchmark's first-byte budget.
//
// Portkey gets the same requests without "stream": versions 1.15.2 and
// 1.9.8 (the two the npm registry here serves) answer every streaming
// request to an OpenAI-compatible custom host with 500 "Something went
// wrong" on Node 20 (TypeError: immutable, when it adds its own headers to
// the passed-through stream's response). The load generator reads every
// answer to its end, so the times still compare: the whole answer in
// both cases.
//
// The gateway listens on every interface and has no option to choose
// one. The benchmark starts node with a preloaded module that makes every
// listen in the process bind 127.0.0.1, and checks in /proc/net/tcp and
// tcp6 that the gateway's port is bound to loopback only before sending it
// anything.

// PeerPortkey is Portkey's gateway, run when PeersSettings.Portkey is set.
const PeerPortkey = "Portkey gateway"

// portkeyEntry is the gateway's start script inside an npm install.
const portkeyEntry = "node_modules/@portkey-ai/gateway/build/start-server.js"

// PortkeyScript returns the gateway's start script for path: the script
// itself, or a directory where @portkey-ai/gateway is installed.
func PortkeyScript(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("bench peers: portkey: %w", err)
	}
	if fi.IsDir() {
		path = filepath.Join(path, portkeyEntry)
		if _, err := os.Stat(path); err != nil {
			return "", fmt.Errorf("bench peers: portkey: no gateway installed there: %w", err)
		}
	}
	return path, nil
}

// loopbackOnly is the preloaded module: every net.Server.listen in the
// process binds 127.0.0.1, whatever host the caller asked for.
const loopbackOnly = `import net from 'node:net';
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (args[0] !== null && typeof args[0] === 'object') {
    args[0] = { ...args[0], host: '127.0.0.1' };
  } else if (typeof args[0] === 'number' || typeof args[0] === 'string') {
    if (args.length > 1 && typeof args[1] !== 'function') args[1] = '127.0.0.1';
    else args.splice(1, 0, '127.0.0.1');
  }
  return listen.apply(this, args);
};
`

// portkeyStrategy and portkeyTarget are the parts of a Portkey config
// the benchmark uses.
type portkeyStrategy struct {
	Mode          string `json:"mode"`
	OnStatusCodes []int  `json:"on_status_codes,omitempty"`
}

type portkeyTarget struct {
	Strategy   *portkeyStrategy `json:"strategy,omitempty"`
	Targets    []portkeyTarget  `json:"targets,omitempty"`
	Provider   string           `json:"provider,omitempty"`
	APIKey     string           `json:"api_key,omitempty"`
	CustomHost string           `json:"custom_host,omitempty"`
	Weight     float64          `json:"weight,omitempty"`
}

// portkeyConfig is the x-portkey-config of every request to the gateway.
func portkeyConfig(backends []string, firstByteMs int64) (string, error) {
	codes := []int{408, 429, 500, 502, 503, 504}
	var lb []portkeyTarget
	for i := range backends {
		chain := portkeyTarget{Strategy: &portkeyStrategy{Mode: "fallback", OnStatusCodes: codes}, Weight: 1}
		for k := range min(3, len(backends)) {
			chain.Targets = append(chain.Targets, portkeyTarget{Provider: "openai", APIKey: "bench", CustomHost: backends[(i+k)%len(backends)] + "/v1"})
		}
		lb = append(lb, chain)
	}
	b, err := json.Marshal(struct {
		Strategy       portkeyStrategy `json:"strategy"`
		Targets        []portkeyTarget `json:"targets"`
		RequestTimeout int64           `json:"request_timeout"`
	}{portkeyStrategy{Mode: "loadbalance"}, lb, firstByteMs})
	return string(b), err
}

// portkeyHeaders are the headers of every request to the gateway: its
// config, and the benchmark's tags forwarded to the backends.
func (p *peerRun) portkeyHeaders() (map[string]string, error) {
	cfg, err := portkeyConfig(p.urls, p.s.FirstByte.Milliseconds())
	if err != nil {
		return nil, err
	}
	return map[string]string{
		"x-portkey-config":          cfg,
		"x-portkey-forward-headers": strings.ToLower(balancerHeader + "," + phaseHeader),
	}, nil
}

func (p *peerRun) startPortkey(ctx context.Context, instance int) (string, error) {
	preload := filepath.Join(p.dir, "loopback-only.mjs")
	if _, err := os.Stat(preload); err != nil {
		if err := os.WriteFile(preload, []byte(loopbackOnly), 0o644); err != nil {
			return "", err
		}
	}
	port, err := freePort()
	if err != nil {
		return "", err
	}
	name := fmt.Sprintf("portkey-%d", instance)
	if err := p.startProcess(ctx, name, p.s.Node, "--import", preload, p.s.Portkey, "--port="+strconv.Itoa(port), "--headless"); err != nil {
		return "", err
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	if err := waitListening(ctx, base, 20*time.Second); err != nil {
		return "", fmt.Errorf("bench peers: %s: %w", name, err)
	}
	if err := loopbackListener(port); err != nil {
		return "", fmt.Errorf("bench peers: %s: %w", name, err)
	}
	return base, nil
}

// loopbackListener checks that every listening socket on port is bound to
// a loopback address (127.0.0.0/8 or ::1), from /proc/net/tcp and tcp6.
func loopbackListener(port int) error {
	found := false
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(file)
		if err != nil {
			if file == "/proc/net/tcp6" && os.IsNotExist(err) {
				continue
			}
			return err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 4 || fields[3] != "0A" { // 0A: LISTEN
				continue
			}
			addr, portHex, ok := strings.Cut(fields[1], ":")
			if p, err := strconv.ParseUint(portHex, 16, 16); !ok || err != nil || int(p) != port {
				continue
			}
			found = true
			if !loopbackHex(addr) {
				f.Close()
				return fmt.Errorf("port %d listens on %s (%s), not loopback only", port, addr, file)
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return err
		}
	}
	if !found {
		return fmt.Errorf("no listening socket on port %d", port)
	}
	return nil
}

// loopbackHex reports whether a /proc/net/tcp address (little-endian hex
// words) is 127.0.0.0/8, ::1 or ::ffff:127.0.0.0/104.
func loopbackHex(addr string) bool {
	switch len(addr) {
	case 8: // IPv4: the first octet is the last byte
		return strings.HasSuffix(addr, "7F")
	case 32:
		return addr == "00000000000000000000000001000000" ||
			(addr[:16] == "0000000000000000" && addr[16:24] == "FFFF0000" && strings.HasSuffix(addr, "7F"))
	}
	return false
}
