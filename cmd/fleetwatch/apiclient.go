package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
)

// apiFlags are the flags of a command that is a client of serve's HTTP API
// (explain, override).
type apiFlags struct {
	base     *string
	tokenEnv *string
}

func registerAPIFlags(fs *flag.FlagSet) apiFlags {
	return apiFlags{
		base:     fs.String("url", "http://127.0.0.1:8080", "serve's HTTP address (http.listen)"),
		tokenEnv: fs.String("token-env", "", "environment variable holding serve's bearer token (http.bearer_token_env)"),
	}
}

// call sends method path (with its query) to serve, with body as JSON when
// not nil, and returns the body of a 200 answer. Any other answer is an
// error wrapping kind with serve's message (the "error" of its JSON, else
// the body).
func (a apiFlags) call(ctx context.Context, kind error, method, path string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(*a.base, "/")+path, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", kind, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if *a.tokenEnv != "" {
		req.Header.Set("Authorization", "Bearer "+os.Getenv(*a.tokenEnv))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", kind, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", kind, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		json.Unmarshal(data, &e)
		if e.Error == "" {
			e.Error = strings.TrimSpace(string(data))
		}
		return nil, fmt.Errorf("%w: %s: %s", kind, resp.Status, e.Error)
	}
	return data, nil
}
