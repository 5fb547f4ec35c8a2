package fakeai

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Identity is what a fake backend says about the artefact it serves, the
// way vLLM does: the root and max_model_len of GET /v1/models, the version
// of GET /version, and the configuration info gauges of GET /metrics
// (`vllm:model_config_info` with model, served_model_name, quantization,
// dtype, max_model_len; `vllm:cache_config_info` with block_size and
// cache_dtype). The zero value is an unquantized bfloat16 model. Change it
// while the server runs with Server.SetIdentity or
// POST /admin/identity (a JSON Identity; absent fields keep their value).
type Identity struct {
	// Root is /v1/models' root and the model label of the info gauge. If
	// empty, "/models/" + the model id.
	Root string `json:"root,omitempty"`
	// MaxModelLen is /v1/models' max_model_len. If zero, 4096.
	MaxModelLen int `json:"max_model_len,omitempty"`
	// Version is GET /version's. If empty, "fakeai-1".
	Version string `json:"version,omitempty"`
	// Quantization is the quantization label (vLLM writes "None" for an
	// unquantized model). If empty, "None".
	Quantization string `json:"quantization,omitempty"`
	// DType is the dtype label. If empty, "bfloat16".
	DType string `json:"dtype,omitempty"`
	// CacheDType is cache_config_info's cache_dtype. If empty, "auto".
	CacheDType string `json:"cache_dtype,omitempty"`
	// NoMetrics answers GET /metrics with 404, like a backend that
	// exposes none; NoVersion does the same for GET /version.
	NoMetrics bool `json:"no_metrics,omitempty"`
	NoVersion bool `json:"no_version,omitempty"`
}

// Quantized is the variant of i served with another quantization method
// and the weights of another directory, as a redeployment of the same
// model name with, say, AWQ weights would be.
func (i Identity) Quantized(method string) Identity {
	i.Quantization = method
	if i.Root != "" {
		i.Root += "-" + strings.ToLower(method)
	}
	return i
}

func (i Identity) withDefaults(model string) Identity {
	if i.Root == "" {
		i.Root = "/models/" + model
		if i.Quantization != "" && i.Quantization != "None" {
			i.Root += "-" + strings.ToLower(i.Quantization)
		}
	}
	if i.MaxModelLen == 0 {
		i.MaxModelLen = 4096
	}
	if i.Version == "" {
		i.Version = "fakeai-1"
	}
	if i.Quantization == "" {
		i.Quantization = "None"
	}
	if i.DType == "" {
		i.DType = "bfloat16"
	}
	if i.CacheDType == "" {
		i.CacheDType = "auto"
	}
	return i
}

// Identity returns the current identity (as set, without defaults).
func (s *Server) Identity() Identity {
	s.idMu.Lock()
	defer s.idMu.Unlock()
	return s.identity
}

// SetIdentity replaces the identity.
func (s *Server) SetIdentity(i Identity) {
	s.idMu.Lock()
	s.identity = i
	s.idMu.Unlock()
}

// servedIdentity is the identity with its defaults, for the model served
// now.
func (s *Server) servedIdentity() (Identity, string) {
	model := s.Behavior().model()
	return s.Identity().withDefaults(model), model
}

// identityRoutes serves GET /v1/models and GET /version.
func (s *Server) identityRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		id, model := s.servedIdentity()
		writeJSON(w, http.StatusOK, map[string]any{
			"object": "list",
			"data": []map[string]any{{
				"id": model, "object": "model", "created": 0, "owned_by": "fakeai",
				"root": id.Root, "max_model_len": id.MaxModelLen,
			}},
		})
	})
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, r *http.Request) {
		id, model := s.servedIdentity()
		if id.NoVersion {
			http.NotFound(w, r)
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"version": id.Version, "model": model})
	})
}

// The configuration info gauges follow the load gauges on GET /metrics
// (metrics.go serves it; NoMetrics makes it 404).
func init() {
	metricFamilies = append(metricFamilies, func(s *Server, w io.Writer) { s.WriteIdentityMetrics(w) })
}

// identityAdmin serves GET and POST /admin/identity (in AdminHandler, so
// that `fleetwatch fake`'s admin listener reaches it too).
func (s *Server) identityAdmin(mux *http.ServeMux) {
	mux.HandleFunc("POST /admin/identity", func(w http.ResponseWriter, r *http.Request) {
		cur := s.Identity()
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<14))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cur); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
			return
		}
		s.SetIdentity(cur)
		writeJSON(w, http.StatusOK, cur)
	})
	mux.HandleFunc("GET /admin/identity", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.Identity())
	})
}

// WriteIdentityMetrics writes the configuration info gauges of the served
// identity in the Prometheus text format, as vLLM does (a gauge set to 1
// whose labels carry the configuration). A /metrics handler that serves
// other series too calls it.
func (s *Server) WriteIdentityMetrics(w io.Writer) {
	id, model := s.servedIdentity()
	fmt.Fprintf(w, "# HELP vllm:model_config_info Information of the LLMEngine ModelConfig\n# TYPE vllm:model_config_info gauge\n")
	fmt.Fprintf(w, "vllm:model_config_info{dtype=%q,max_model_len=\"%d\",model=%q,quantization=%q,served_model_name=%q} 1.0\n",
		id.DType, id.MaxModelLen, id.Root, id.Quantization, model)
	fmt.Fprintf(w, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n")
	fmt.Fprintf(w, "vllm:cache_config_info{block_size=\"16\",cache_dtype=%q,enable_prefix_caching=\"True\",gpu_memory_utilization=\"0.9\",num_gpu_blocks=\"2048\"} 1.0\n",
		id.CacheDType)
}
