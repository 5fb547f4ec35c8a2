package fakeai

import (
	"encoding/json"
	"net/http"
)

// AdminHandler routes the admin requests of several backends, each on its
// own address, from one listener (`fleetwatch fake`). It is kept apart
// from the backends so that a backend told to refuse connections can be
// told to accept them again:
//
//	GET  /admin/backends              names and URLs, in the order given
//	GET  /admin/<name>/behavior       the current behavior
//	POST /admin/<name>/behavior       change it, e.g. {"refuse":true} or {"error_rate":0.5}
//	GET  /admin/<name>/stats          request counters
//	POST /admin/<name>/tools          how requests with tools are answered, e.g. {"break":0.4}
//	POST /admin/<name>/artefact       serve another artefact, {"variant":"fp16"}
//
// Every /admin/<name>/... request other than artefact goes to the named
// backend's AdminHandler. artefact builds the completer of a variant named
// in a POST /admin/<name>/artefact (an error is answered 400); if nil,
// that request is answered 404. Backends are told apart by Name.
func AdminHandler(backends []*Server, artefact func(variant string) (Completer, error)) http.Handler {
	byName := make(map[string]*Server, len(backends))
	for _, b := range backends {
		byName[b.Name()] = b
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /admin/{name}/artefact", func(w http.ResponseWriter, r *http.Request) {
		srv := byName[r.PathValue("name")]
		if srv == nil || artefact == nil {
			http.Error(w, "no such backend, or not --completer toy", http.StatusNotFound)
			return
		}
		var req struct {
			Variant string `json:"variant"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<12)).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c, err := artefact(req.Variant)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		srv.SetCompleter(c)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"backend": srv.Name(), "variant": req.Variant})
	})
	mux.HandleFunc("GET /admin/backends", func(w http.ResponseWriter, r *http.Request) {
		type entry struct {
			Name string `json:"name"`
			URL  string `json:"url"`
		}
		list := make([]entry, len(backends))
		for i, b := range backends {
			list[i] = entry{b.Name(), b.URL()}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(list)
	})
	mux.HandleFunc("/admin/{name}/{rest...}", func(w http.ResponseWriter, r *http.Request) {
		srv := byName[r.PathValue("name")]
		if srv == nil {
			http.Error(w, "no such backend", http.StatusNotFound)
			return
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/admin/" + r.PathValue("rest")
		srv.AdminHandler().ServeHTTP(w, r2)
	})
	return mux
}
