package fakeai

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestIdentityEndpoints(t *testing.T) {
	srv := New(Settings{Name: "a", Behavior: Behavior{Model: "llama"}})
	hs := httptest.NewServer(srv)
	defer hs.Close()
	_, models := get(t, hs.URL+"/v1/models")
	var m struct {
		Data []struct {
			ID          string `json:"id"`
			Root        string `json:"root"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(models), &m); err != nil || len(m.Data) != 1 || m.Data[0].Root != "/models/llama" || m.Data[0].MaxModelLen != 4096 {
		t.Fatalf("/v1/models %s (%v)", models, err)
	}
	if code, metrics := get(t, hs.URL+"/metrics"); code != 200 ||
		!strings.Contains(metrics, `vllm:model_config_info{dtype="bfloat16",max_model_len="4096",model="/models/llama",quantization="None",served_model_name="llama"} 1.0`) ||
		!strings.Contains(metrics, `cache_dtype="auto"`) {
		t.Errorf("/metrics %d:\n%s", code, metrics)
	}

	// the variant, through the multi-backend admin handler of `fleetwatch fake`
	admin := httptest.NewServer(AdminHandler([]*Server{srv}, nil))
	defer admin.Close()
	resp, err := http.Post(admin.URL+"/admin/a/identity", "application/json", strings.NewReader(`{"quantization":"AWQ","version":"0.12.0","root":"/models/llama-awq"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST /admin/a/identity: %d", resp.StatusCode)
	}
	if _, metrics := get(t, hs.URL+"/metrics"); !strings.Contains(metrics, `model="/models/llama-awq",quantization="AWQ"`) {
		t.Errorf("/metrics after the change:\n%s", metrics)
	}
	if _, v := get(t, hs.URL+"/version"); !strings.Contains(v, `"version":"0.12.0"`) {
		t.Errorf("/version after the change: %s", v)
	}
	if got := srv.Identity(); got != (Identity{Quantization: "AWQ", Version: "0.12.0", Root: "/models/llama-awq"}) {
		t.Errorf("Identity() = %+v", got)
	}
	if q := (Identity{Root: "/m/x"}).Quantized("GPTQ"); q.Root != "/m/x-gptq" || q.Quantization != "GPTQ" {
		t.Errorf("Quantized: %+v", q)
	}
	srv.SetIdentity(Identity{NoMetrics: true, NoVersion: true})
	for _, path := range []string{"/metrics", "/version"} {
		if code, _ := get(t, hs.URL+path); code != http.StatusNotFound {
			t.Errorf("%s without it: %d, want 404", path, code)
		}
	}
	resp, err = http.Post(hs.URL+"/admin/identity", "application/json", strings.NewReader(`{"quantisation":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("unknown field: %d, want 400", resp.StatusCode)
	}
}
