package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/control"
)

func init() {
	register("override", "operator overrides: drain|force-open|force-closed|weight|clear POOL BACKEND --reason TEXT --for DURATION, or list", runOverride)
}

// errOverride is a refused or failed /api/overrides request.
var errOverride = errors.New("override")

// runOverride is `fleetwatch override ACTION POOL BACKEND` and `fleetwatch
// override list`: a thin client of serve's /api/overrides.
func runOverride(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("override", flag.ContinueOnError)
	api := registerAPIFlags(fs)
	reason := fs.String("reason", "", "why (required: it goes to the audit)")
	dur := fs.Duration("for", 0, "how long the override lasts (required but for clear and list; at most 168h)")
	weight := fs.Float64("weight", -1, "the weight of a weight override, in [0, 1]")
	who := fs.String("who", os.Getenv("USER"), "who sets it (basic authentication's user wins)")
	force := fs.Bool("force", false, "set it even though the pool or backend is neither configured nor in a current snapshot (a planned backend); without it serve refuses, to catch typos")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: fleetwatch override drain|force-open|force-closed|weight|clear POOL BACKEND --reason TEXT [--for DURATION] [--weight W] [--force]\n       fleetwatch override list")
		fs.PrintDefaults()
	}
	pos, err := parseArgs(fs, args, stderr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if len(pos) == 1 && pos[0] == "list" {
		reply, err := overrideCall(ctx, api, http.MethodGet, nil)
		if err != nil {
			return err
		}
		return control.WriteOverrides(stdout, reply.Overrides)
	}
	if len(pos) != 3 {
		fs.Usage()
		return errUsage
	}
	req := control.OverrideRequest{Action: strings.ReplaceAll(pos[0], "-", "_"), Pool: pos[1], Backend: pos[2], Reason: *reason, Who: *who, Force: *force}
	if *dur != 0 {
		req.For = dur.String()
	}
	if *weight >= 0 {
		req.Weight = weight
	}
	body, _ := json.Marshal(req)
	reply, err := overrideCall(ctx, api, http.MethodPost, body)
	if err != nil {
		return err
	}
	return control.WriteOverrideDone(stdout, req.Action, reply.Override)
}

func overrideCall(ctx context.Context, api apiFlags, method string, body []byte) (control.OverrideReply, error) {
	var reply control.OverrideReply
	data, err := api.call(ctx, errOverride, method, "/api/overrides", body)
	if err != nil {
		return reply, err
	}
	if err := json.Unmarshal(data, &reply); err != nil {
		return reply, fmt.Errorf("%w: %v", errOverride, err)
	}
	return reply, nil
}
