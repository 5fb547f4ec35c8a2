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
	"time"

	"github.com/fleetwatch/fleetwatch/internal/control"
)

func init() {
	register("explain", "why a backend is in its state, with what weight (fleetwatch explain POOL [BACKEND])", runExplain)
}

// errExplain is a refused or failed /api/explain request.
var errExplain = errors.New("explain")

// runExplain is `fleetwatch explain POOL [BACKEND]`: it asks a running
// serve's /api/explain and prints the answer (internal/control's
// WriteExplained), or the JSON with --json.
func runExplain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	api := registerAPIFlags(fs)
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
	body, err := api.call(ctx, errExplain, http.MethodGet, "/api/explain?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	if *asJSON {
		_, err := stdout.Write(body)
		return err
	}
	var ex control.Explained
	if err := json.Unmarshal(body, &ex); err != nil {
		return fmt.Errorf("%w: %v", errExplain, err)
	}
	return control.WriteExplained(stdout, ex)
}
