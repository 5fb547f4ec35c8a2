package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/serve"
)

func init() {
	register("explain", "why a backend is in its state, with what weight (fleetwatch explain POOL [BACKEND])", runExplain)
}

// errExplain is a refused or failed /api/explain request.
var errExplain = errors.New("explain")

// runExplain is `fleetwatch explain POOL [BACKEND]`: it asks a running
// serve's /api/explain and prints the answer (internal/serve's
// WriteExplained), or the JSON with --json.
func runExplain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	base := fs.String("url", "http://127.0.0.1:8080", "serve's HTTP address (http.listen)")
	tokenEnv := fs.String("token-env", "", "environment variable holding serve's bearer token (http.bearer_token_env)")
	asJSON := fs.Bool("json", false, "print the JSON of /api/explain")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: fleetwatch explain [flags] POOL [BACKEND]")
		fs.PrintDefaults()
	}
	pos, err := parseArgs(fs, args, stderr) // the pool and backend before or after the flags
	if err != nil {
		return err
	}
	if len(pos) < 1 || len(pos) > 2 {
		fs.Usage()
		return errUsage
	}
	q := url.Values{"pool": {pos[0]}}
	if len(pos) == 2 {
		q.Set("backend", pos[1])
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(*base, "/")+"/api/explain?"+q.Encode(), nil)
	if err != nil {
		return fmt.Errorf("%w: %v", errExplain, err)
	}
	if *tokenEnv != "" {
		req.Header.Set("Authorization", "Bearer "+os.Getenv(*tokenEnv))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %v", errExplain, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%w: %v", errExplain, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		json.Unmarshal(body, &e)
		if e.Error == "" {
			e.Error = strings.TrimSpace(string(body))
		}
		return fmt.Errorf("%w: %s: %s", errExplain, resp.Status, e.Error)
	}
	if *asJSON {
		_, err := stdout.Write(body)
		return err
	}
	var ex serve.Explained
	if err := json.Unmarshal(body, &ex); err != nil {
		return fmt.Errorf("%w: %v", errExplain, err)
	}
	return serve.WriteExplained(stdout, ex)
}
