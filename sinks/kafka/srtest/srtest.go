// Package srtest is a Confluent Schema Registry for tests: an HTTP server
// that answers the part of the registry's REST API a producer and a
// deserializer use, as Confluent documents it (schema-registry/develop/api):
//
//	GET  /subjects                          the subjects
//	POST /subjects/{subject}/versions       register, or return the id of an equal schema
//	POST /subjects/{subject}                look a schema up in a subject
//	GET  /subjects/{subject}/versions/latest
//	GET  /schemas/ids/{id}
//
// Errors are JSON objects {"error_code": ..., "message": ...} with the
// registry's codes (40401 subject not found, 40403 schema not found, 409
// incompatible, 42201 invalid schema, 40301 forbidden). One id is given to
// equal schema texts of one type across subjects, as the registry does. It
// checks no compatibility; Reject makes a subject refuse new schemas.
//
// A Registry is safe for concurrent use.
package srtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
)

// Registry is a running test registry.
type Registry struct {
	*httptest.Server

	mu       sync.Mutex
	schemas  []stored         // by id-1
	subjects map[string][]int // subject -> ids, by version-1
	rejected map[string]bool  // subjects that refuse new schemas (409)
	readOnly bool             // registering is forbidden (403)
	requests map[string]int   // "POST /subjects/{subject}/versions" -> count
	user     *[2]string       // basic auth, when required
}

type stored struct {
	Schema     string `json:"schema"`
	SchemaType string `json:"schemaType,omitempty"`
}

// TB is the part of testing.TB a Registry needs.
type TB interface{ Cleanup(func()) }

// New starts a registry on http://127.0.0.1; it stops with the test.
func New(t TB) *Registry { return start(t, false) }

// NewTLS starts a registry on https://127.0.0.1 whose certificate
// Certificate returns (httptest's, for 127.0.0.1 and example.com).
func NewTLS(t TB) *Registry { return start(t, true) }

func start(t TB, useTLS bool) *Registry {
	r := &Registry{subjects: map[string][]int{}, rejected: map[string]bool{}, requests: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /subjects", r.listSubjects)
	mux.HandleFunc("POST /subjects/{subject}/versions", r.withSchema(r.register))
	mux.HandleFunc("POST /subjects/{subject}", r.withSchema(r.lookup))
	mux.HandleFunc("GET /subjects/{subject}/versions/latest", r.latest)
	mux.HandleFunc("GET /schemas/ids/{id}", r.byID)
	r.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.requests[req.Method+" "+req.URL.Path]++
		user := r.user
		r.mu.Unlock()
		if user != nil {
			u, p, ok := req.BasicAuth()
			if !ok || u != user[0] || p != user[1] {
				writeError(w, http.StatusUnauthorized, 40101, "Unauthorized")
				return
			}
		}
		mux.ServeHTTP(w, req)
	}))
	if useTLS {
		r.StartTLS()
	} else {
		r.Start()
	}
	t.Cleanup(r.Close)
	return r
}

// RequireBasicAuth makes every request need these credentials.
func (r *Registry) RequireBasicAuth(user, pass string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.user = &[2]string{user, pass}
}

// ReadOnly forbids registering (403, error 40301), as a registry does for a
// principal that may only read.
func (r *Registry) ReadOnly(on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.readOnly = on
}

// Reject makes subject refuse every schema it does not hold yet as
// incompatible (409).
func (r *Registry) Reject(subject string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rejected[subject] = true
}

// Register registers text of schemaType (AVRO, JSON) under subject, as a
// CI job would, and returns its id.
func (r *Registry) Register(subject, schemaType, text string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	id, _ := r.add(subject, stored{Schema: text, SchemaType: normType(schemaType)})
	return id
}

// Requests counts the requests of method to path so far.
func (r *Registry) Requests(method, path string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests[method+" "+path]
}

// Subjects returns the subjects and their schema ids, by version.
func (r *Registry) Subjects() map[string][]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string][]int, len(r.subjects))
	for s, ids := range r.subjects {
		out[s] = slices.Clone(ids)
	}
	return out
}

// Schema returns the text of id, or "".
func (r *Registry) Schema(id int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if id < 1 || id > len(r.schemas) {
		return ""
	}
	return r.schemas[id-1].Schema
}

func normType(t string) string {
	if t == "AVRO" {
		return "" // the registry leaves the default type out
	}
	return t
}

// add stores s under subject; r.mu is held. It returns the id and the
// version.
func (r *Registry) add(subject string, s stored) (int, int) {
	id := slices.Index(r.schemas, s) + 1
	if id == 0 {
		r.schemas = append(r.schemas, s)
		id = len(r.schemas)
	}
	if v := slices.Index(r.subjects[subject], id); v >= 0 {
		return id, v + 1
	}
	r.subjects[subject] = append(r.subjects[subject], id)
	return id, len(r.subjects[subject])
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status, code int, msg string) {
	writeJSON(w, status, map[string]any{"error_code": code, "message": msg})
}

// readSchema decodes a request's schema, answering 422 when it is not one.
func readSchema(w http.ResponseWriter, req *http.Request) (stored, bool) {
	var body struct {
		Schema     string            `json:"schema"`
		SchemaType string            `json:"schemaType"`
		References []json.RawMessage `json:"references"`
	}
	if err := json.NewDecoder(req.Body).Decode(&body); err != nil {
		writeError(w, http.StatusUnprocessableEntity, 422, "Unprocessable entity: "+err.Error())
		return stored{}, false
	}
	switch body.SchemaType {
	case "", "AVRO", "JSON":
	default:
		writeError(w, http.StatusUnprocessableEntity, 42201, "Invalid schema type "+body.SchemaType)
		return stored{}, false
	}
	if !json.Valid([]byte(body.Schema)) {
		writeError(w, http.StatusUnprocessableEntity, 42201, "Invalid schema: not JSON")
		return stored{}, false
	}
	return stored{Schema: body.Schema, SchemaType: normType(body.SchemaType)}, true
}

func (r *Registry) listSubjects(w http.ResponseWriter, _ *http.Request) {
	r.mu.Lock()
	subjects := make([]string, 0, len(r.subjects))
	for s := range r.subjects {
		subjects = append(subjects, s)
	}
	r.mu.Unlock()
	slices.Sort(subjects)
	writeJSON(w, http.StatusOK, subjects)
}

// withSchema serves a request that posts a schema to a subject: h runs
// with r.mu held.
func (r *Registry) withSchema(h func(w http.ResponseWriter, subject string, s stored)) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		s, ok := readSchema(w, req)
		if !ok {
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		h(w, req.PathValue("subject"), s)
	}
}

func (r *Registry) register(w http.ResponseWriter, subject string, s stored) {
	if r.readOnly {
		writeError(w, http.StatusForbidden, 40301, "User is denied operation Write on Subject: "+subject)
		return
	}
	if r.rejected[subject] {
		if id := slices.Index(r.schemas, s) + 1; id == 0 || !slices.Contains(r.subjects[subject], id) {
			writeError(w, http.StatusConflict, 409, "Schema being registered is incompatible with an earlier schema for subject \""+subject+"\"")
			return
		}
	}
	id, _ := r.add(subject, s)
	writeJSON(w, http.StatusOK, map[string]int{"id": id})
}

func (r *Registry) lookup(w http.ResponseWriter, subject string, s stored) {
	ids, ok := r.subjects[subject]
	if !ok {
		writeError(w, http.StatusNotFound, 40401, "Subject '"+subject+"' not found.")
		return
	}
	id := slices.Index(r.schemas, s) + 1
	v := slices.Index(ids, id)
	if id == 0 || v < 0 {
		writeError(w, http.StatusNotFound, 40403, "Schema not found")
		return
	}
	writeJSON(w, http.StatusOK, r.subjectSchema(subject, v+1, id))
}

func (r *Registry) subjectSchema(subject string, version, id int) map[string]any {
	s := r.schemas[id-1]
	out := map[string]any{"subject": subject, "version": version, "id": id, "schema": s.Schema}
	if s.SchemaType != "" {
		out["schemaType"] = s.SchemaType
	}
	return out
}

func (r *Registry) latest(w http.ResponseWriter, req *http.Request) {
	subject := req.PathValue("subject")
	r.mu.Lock()
	defer r.mu.Unlock()
	ids, ok := r.subjects[subject]
	if !ok {
		writeError(w, http.StatusNotFound, 40401, "Subject '"+subject+"' not found.")
		return
	}
	writeJSON(w, http.StatusOK, r.subjectSchema(subject, len(ids), ids[len(ids)-1]))
}

func (r *Registry) byID(w http.ResponseWriter, req *http.Request) {
	id, err := strconv.Atoi(req.PathValue("id"))
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil || id < 1 || id > len(r.schemas) {
		writeError(w, http.StatusNotFound, 40403, fmt.Sprintf("Schema %s not found", req.PathValue("id")))
		return
	}
	writeJSON(w, http.StatusOK, r.schemas[id-1])
}
