package fakeai

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// startAdmin serves AdminHandler(backends, artefact) on a loopback port and
// returns its URL.
func startAdmin(t *testing.T, backends []*Server, artefact func(string) (Completer, error)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: AdminHandler(backends, artefact)}
	done := make(chan struct{})
	go func() { defer close(done); hs.Serve(ln) }() // exits when hs closes in the cleanup
	t.Cleanup(func() { hs.Close(); <-done })
	return "http://" + ln.Addr().String()
}

func TestAdminHandlerRoutesToTheNamedBackend(t *testing.T) {
	a, b := start(t, Settings{Name: "a"}), start(t, Settings{Name: "b"})
	admin := startAdmin(t, []*Server{a, b}, nil)
	ctx := testCtx(t)

	resp, err := http.Get(admin + "/admin/backends")
	if err != nil {
		t.Fatal(err)
	}
	var list []struct{ Name, URL string }
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ Name, URL string }{{"a", a.URL()}, {"b", b.URL()}}
	if diff := cmp.Diff(want, list); diff != "" {
		t.Errorf("GET /admin/backends (-want +got):\n%s", diff)
	}

	if code, _, body := mustPost(ctx, t, admin+"/admin/b/behavior", map[string]any{"throttle_rate": 1}); code != 200 {
		t.Fatalf("POST /admin/b/behavior: %d %s", code, body)
	}
	if b.Behavior().ThrottleRate != 1 || a.Behavior().ThrottleRate != 0 {
		t.Errorf("throttle rates a %v b %v, want 0 and 1", a.Behavior().ThrottleRate, b.Behavior().ThrottleRate)
	}
	if code, _, _ := mustPost(ctx, t, b.URL()+"/v1/completions", map[string]any{"prompt": "x"}); code != 429 {
		t.Errorf("throttling backend b answered %d, want 429", code)
	}
	if code, _, _ := mustPost(ctx, t, a.URL()+"/v1/completions", map[string]any{"prompt": "x"}); code != 200 {
		t.Errorf("backend a answered %d, want 200", code)
	}
	resp, err = http.Get(admin + "/admin/b/stats")
	if err != nil {
		t.Fatal(err)
	}
	var st Stats
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || st.Throttled != 1 {
		t.Errorf("GET /admin/b/stats: %+v %v, want 1 throttled", st, err)
	}
	if code, _, _ := mustPost(ctx, t, admin+"/admin/nope/behavior", map[string]any{}); code != 404 {
		t.Errorf("unknown backend: status %d, want 404", code)
	}
	if code, _, _ := mustPost(ctx, t, admin+"/admin/a/artefact", map[string]any{"variant": "const"}); code != 404 {
		t.Errorf("artefact without a builder: status %d, want 404", code)
	}
}

func TestAdminHandlerSwapsTheArtefact(t *testing.T) {
	a := start(t, Settings{Name: "a"})
	var asked []string
	admin := startAdmin(t, []*Server{a}, func(variant string) (Completer, error) {
		asked = append(asked, variant)
		if variant != "const" {
			return nil, errors.New("unknown variant")
		}
		return constCompleter{}, nil
	})
	ctx := testCtx(t)
	fingerprint := func() string {
		_, _, body := mustPost(ctx, t, a.URL()+"/v1/chat/completions", chatBody(nil))
		return decode(t, body).SystemFingerprint
	}
	if fp := fingerprint(); fp != "fp_echo" {
		t.Fatalf("fingerprint before the swap %q, want fp_echo", fp)
	}
	code, _, body := mustPost(ctx, t, admin+"/admin/a/artefact", map[string]any{"variant": "const"})
	if code != 200 {
		t.Fatalf("POST /admin/a/artefact: %d %s", code, body)
	}
	var got map[string]string
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"backend": "a", "variant": "const"}, got); diff != "" {
		t.Errorf("artefact reply (-want +got):\n%s", diff)
	}
	if fp := fingerprint(); fp != "fp_const" {
		t.Errorf("fingerprint after the swap %q, want fp_const", fp)
	}
	if code, _, _ := mustPost(ctx, t, admin+"/admin/a/artefact", map[string]any{"variant": "nope"}); code != 400 {
		t.Errorf("unknown variant: status %d, want 400", code)
	}
	if code, _, _ := mustPost(ctx, t, admin+"/admin/a/artefact", "not an object"); code != 400 {
		t.Errorf("malformed request: status %d, want 400", code)
	}
	if diff := cmp.Diff([]string{"const", "nope"}, asked); diff != "" {
		t.Errorf("variants asked of the builder (-want +got):\n%s", diff)
	}
}
